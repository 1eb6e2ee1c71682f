// The strategy harness (NOTE [training strategies]): each data-parallel
// strategy trains the same model on the same global batches from the same
// weights, at 2 and 4 ranks over gloo (in-process ranks, one thread each,
// one compute thread), and the harness prints per strategy:
//  - correctness: every rank's sum of weight norms after the steps (the
//    weights exported by all ranks together), which must be equal across
//    ranks and equal to a single engine's on the whole batches;
//  - peak bytes of LibTorch CPU storage per rank while it trains (NOTE
//    [counting allocator]: each rank's thread tagged; what it holds after
//    joining and its steps' peak) against ddp's and against the planner's
//    per-rank peak for the same model and micro-batch (NOTE [rank memory]);
//  - step time and tokens/s, relative to ddp;
//  - bytes received per rank per step, measured on the ranks' TCP sockets
//    (TCP_INFO), against the bandwidth-optimal volume of the strategy
//    (ddp's ring all-reduce 2(N−1)/N·Φ; zero1 and zero2 a reduce-scatter
//    and an all-gather, the same; zero3 one more all-gather, 3(N−1)/N·Φ);
//  - gloo's all-reduce bus bandwidth at 2 and 4 ranks against one raw
//    loopback TCP stream between two threads of the same process;
//  - a zero3 weight sync over the broadcast transport, streamed (NOTE
//    [streamed publish]: each bucket sent while the ranks gather the next
//    unit) against export-then-publish, same run;
//  - tensor parallelism (NOTE [tensor parallelism]): TP 2 and DP 2 × TP 2
//    against the single engine's weights, step time against DP 2, and the
//    bytes a TP rank receives per step against Megatron's volume: per
//    block one all-reduce of the [tokens, hidden] activations forward and
//    one backward for attention and for the MLP (plus the embedding's and
//    the LM head input's, and the vocab-parallel log-probs' row sums), each
//    a ring moving 2(TP−1)/TP of it.
//
//   bench_strategies [--quick] [--steps N] [--pipeline]   (--pipeline: that table alone)
#include "actors/rl/data.hpp"
#include "actors/rl/roles.hpp"
#include "actors/train/dp_strategy.hpp"
#include "actors/train/strategy_memory.hpp"
#include "actors/train/train_engine.hpp"
#include "models/llama.hpp"
#include "models/tensor_parallel.hpp"
#include "runtime/collectives.hpp"
#include "runtime/counting_allocator.hpp"
#include "runtime/shm_collectives.hpp"
#include "runtime/weight_transport.hpp"

#include <torch/torch.h>

#include <arpa/inet.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <optional>
#include <string>
#include <vector>

using namespace troupe;
using actors::train::dp_strategy;

namespace {

struct options {
  bool quick = false;
  int steps = 5;
  bool pipeline_only = false; // --pipeline: the pipeline table alone
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick")
      o.quick = true;
    else if (a == "--steps" && i + 1 < argc)
      o.steps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--pipeline")
      o.pipeline_only = true;
    else {
      std::fprintf(stderr, "usage: bench_strategies [--quick] [--steps N] [--pipeline]\n");
      std::exit(2);
    }
  }
  if (o.quick)
    o.steps = 2;
  return o;
}

models::llama_config shape(bool quick) {
  models::llama_config c;
  c.hidden_size = quick ? 64 : 256;
  c.intermediate_size = quick ? 172 : 688;
  c.num_hidden_layers = quick ? 2 : 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.vocab_size = quick ? 512 : 4096;
  c.max_position_embeddings = 256;
  c.tie_word_embeddings = false;
  return c;
}

// Global batches of `rows` prompt + response rows (fixed lengths: every
// rank's share has the same tokens).
std::vector<runtime::tensor_batch> batches(int steps, int64_t rows, int64_t vocab) {
  std::vector<runtime::tensor_batch> out;
  torch::manual_seed(3);
  for (int s = 0; s < steps; ++s) {
    std::vector<std::vector<int64_t>> prompts, responses;
    for (int64_t r = 0; r < rows; ++r) {
      auto p = torch::randint(1, vocab, {24}, torch::kLong);
      auto q = torch::randint(1, vocab, {40}, torch::kLong);
      prompts.emplace_back(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + 24);
      responses.emplace_back(q.data_ptr<int64_t>(), q.data_ptr<int64_t>() + 40);
    }
    auto b = actors::rl::collate_sequences(prompts, responses, 0);
    if (!b) {
      std::fprintf(stderr, "%s\n", describe(b.error()).c_str());
      std::exit(1);
    }
    out.push_back(std::move(*b));
  }
  return out;
}

// Bytes this process's TCP sockets have received (every rank's gloo pairs
// are in this process, so each byte sent between ranks counts once).
int64_t tcp_bytes_received() {
  int64_t total = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = std::atoi(e.path().filename().c_str());
    tcp_info info{};
    socklen_t len = sizeof info;
    if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 &&
        len >= offsetof(tcp_info, tcpi_bytes_received) + sizeof info.tcpi_bytes_received)
      total += static_cast<int64_t>(info.tcpi_bytes_received);
  }
  return total;
}

double weight_norm_sum(const std::map<std::string, at::Tensor>& w) {
  double s = 0;
  for (const auto& [name, t] : w)
    s += t.to(at::kDouble).norm().item<double>();
  return s;
}

// An engine on a copy of `base`, or on rank part's share of it.
std::unique_ptr<actors::train::train_engine>
engine_of(const models::llama_model& base,
          actors::train::precision precision = actors::train::precision::fp32,
          const models::tp_partition* part = nullptr, const models::pp_stage* stage = nullptr) {
  auto m = models::make_llama(base->config(), models::head_kind::lm);
  if (!m || !models::assign_hf_weights(*m, models::export_hf_weights(base), true)) {
    std::fprintf(stderr, "copying the model failed\n");
    std::exit(1);
  }
  if ((part || stage) && !(m = models::make_model_part(*m, part ? *part : models::tp_partition{},
                                                       stage ? *stage : models::pp_stage{}))) {
    std::fprintf(stderr, "%s\n", describe(m.error()).c_str());
    std::exit(1);
  }
  actors::train::optimizer_options o;
  o.lr = 1e-3;
  o.grad_clip = 1.0;
  auto e = actors::train::train_engine::make(*m, o);
  if (!e || !(*e)->set_precision(precision)) {
    std::fprintf(stderr, "%s\n", e ? "set_precision failed" : describe(e.error()).c_str());
    std::exit(1);
  }
  return std::move(*e);
}

struct result {
  double step_s = 0;      // median over the timed steps
  double bubble = 0;      // pipelined: the median step's idle share of the stages' pass
  double critical = 0;    // ... and the busiest stage's own idle share in that step
  std::vector<double> stage_busy_s; // pipelined: each stage's computing per step (median step)
  int64_t peak_bytes = 0; // the largest rank's
  double received_per_step = 0;
  std::vector<double> norm_sums; // a rank each
};

// Rank r's groups of a {dp, pp, tp} mesh over `groups` (made with `go`):
// its store, the mesh, its DP, PP and TP lines, the PP line's hand-offs
// through shared memory when `shm_hand_offs` (NOTE [shm point-to-point]).
struct mesh_shape {
  int dp, tp, pp;
};
expected<std::shared_ptr<actors::train::data_parallel_group>>
rank_groups(runtime::local_groups& groups, int r, mesh_shape m, bool shm_hand_offs,
            const runtime::group_options& go) {
  auto g = std::make_shared<actors::train::data_parallel_group>();
  g->store = std::move(groups.stores[static_cast<size_t>(r)]);
  g->mesh =
      std::make_shared<runtime::process_group>(std::move(groups.groups[static_cast<size_t>(r)]));
  const runtime::rank_mesh mesh{{m.dp, m.pp, m.tp}};
  auto lines = runtime::make_mesh_groups(*g->mesh, mesh, {"dp", "pp", "tp"});
  if (!lines)
    return lines.error();
  g->group = std::move((*lines)[0]);
  auto pp_line = std::move((*lines)[1]);
  if (shm_hand_offs && m.pp > 1) { // as a job's line on one node
    auto shm = runtime::with_shm_point_to_point(
        std::move(pp_line), g->store, go.name + "-pp" + std::to_string(mesh.line_index(r, 1)),
        actors::rl::pp_slot_bytes, actors::rl::pp_slots(m.pp), go.timeout_ms);
    if (!shm)
      return shm.error();
    pp_line = std::move(*shm);
  }
  g->pp = std::make_shared<runtime::process_group>(std::move(pp_line));
  g->tp = std::make_shared<runtime::process_group>(std::move((*lines)[2]));
  return g;
}

// NOTE [1F1B]: a step's bubble is 1 − Σ busy / (stages × the longest
// pass), over one replica's stages; `out` takes the median step's, that
// step's busy seconds a stage and its busiest stage's idle share, 1 −
// busiest / longest (the schedule's bubble on the critical stage, without
// the idle that a slower neighbour adds to a faster stage).
// passes[step][rank] = (wall, busy).
void median_bubble(const std::vector<std::vector<std::pair<double, double>>>& passes, int pp,
                   int tp, result& out) {
  std::vector<std::pair<double, size_t>> bubbles; // (bubble, step)
  for (size_t s = 1; pp > 1 && s < passes.size(); ++s) {
    double longest = 0, busy = 0;
    for (int p = 0; p < pp; ++p) {
      const auto& [wall, computing] = passes[s][static_cast<size_t>(p * tp)];
      longest = std::max(longest, wall);
      busy += computing;
    }
    bubbles.emplace_back(1 - busy / (pp * longest), s);
  }
  if (bubbles.empty())
    return;
  std::sort(bubbles.begin(), bubbles.end());
  const auto [bubble, step] = bubbles[bubbles.size() / 2];
  out.bubble = bubble;
  double longest = 0, busiest = 0;
  for (int p = 0; p < pp; ++p) {
    const auto& [wall, computing] = passes[step][static_cast<size_t>(p * tp)];
    out.stage_busy_s.push_back(computing);
    longest = std::max(longest, wall);
    busiest = std::max(busiest, computing);
  }
  out.critical = 1 - busiest / longest;
}

// `world` ranks as a {world / (pp · tp), pp, tp} mesh: DP over the
// replicas under `strategy`, each replica's pp · tp ranks one model (NOTE
// [tensor parallelism], NOTE [pipeline parallelism]), a batch cut into
// `micro` micro-batches when pipelined.
result run(const models::llama_model& base, const std::vector<runtime::tensor_batch>& global,
           int world, dp_strategy strategy,
           actors::train::precision precision = actors::train::precision::fp32, int tp = 1,
           int pp = 1, int64_t micro = 0, bool shm_hand_offs = false) {
  const int dp = world / (tp * pp);
  runtime::group_options go;
  go.name = "bench-" + std::string{to_string(strategy)} + "-" + std::to_string(world) + "-tp" +
            std::to_string(tp) + "-pp" + std::to_string(pp) + "-m" + std::to_string(micro);
  go.timeout_ms = 120000;
  auto groups = runtime::make_local_groups(world, go);
  if (!groups) {
    std::fprintf(stderr, "%s\n", describe(groups.error()).c_str());
    std::exit(1);
  }
  auto& counter = runtime::counting_allocator::install();
  result out;
  out.norm_sums.resize(static_cast<size_t>(world));
  std::vector<int64_t> peaks(static_cast<size_t>(world));
  std::vector<double> times;
  // [step][rank]: the pipelined pass's wall and busy seconds.
  std::vector<std::vector<std::pair<double, double>>> passes(
      global.size(), std::vector<std::pair<double, double>>(static_cast<size_t>(world)));
  int64_t received_before = 0, received_after = 0;
  auto rank_main = [&](int r) -> expected<void> {
    runtime::counting_allocator::set_thread_tag(r);
    counter.reset_peak(r);
    const auto at_start = counter.counts(r).current;
    auto g = rank_groups(*groups, r, {dp, tp, pp}, shm_hand_offs, go);
    if (!g)
      return g.error();
    auto& group = *(*g)->mesh;
    auto part = models::partition_llama(base->config(), *(*g)->tp);
    auto stage = models::stage_of(base->config(), *(*g)->pp);
    if (!part || !stage)
      return part ? stage.error() : part.error();
    auto e = engine_of(base, precision, &*part, &*stage);
    if (auto ok = e->join_data_parallel(*g, {strategy, 25}); !ok)
      return ok.error();
    if (auto ok = e->set_pipeline_micro_batches(micro); !ok)
      return ok.error();
    counter.reset_peak(r); // the training's peak, not the model's copying in
    for (size_t s = 0; s < global.size(); ++s) {
      auto shares = global[s].split(dp);
      if (!shares)
        return shares.error();
      if (auto ok = group.barrier(); !ok)
        return ok.error();
      if (r == 0 && s == 1)
        received_before = tcp_bytes_received();
      auto t0 = std::chrono::steady_clock::now();
      if (auto m = e->sft_step((*shares)[static_cast<size_t>(r / (tp * pp))]); !m)
        return m.error();
      const auto pass = e->last_pipeline_pass();
      passes[s][static_cast<size_t>(r)] = {pass.seconds, pass.busy_seconds};
      if (auto ok = group.barrier(); !ok)
        return ok.error();
      if (r == 0 && s > 0) // the first step is the warm-up
        times.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    if (r == 0)
      received_after = tcp_bytes_received();
    peaks[static_cast<size_t>(r)] = counter.counts(r).peak - at_start;
    // Under PP the first stage exports (the later ones send it their parts).
    if (stage->first())
      out.norm_sums[static_cast<size_t>(r)] = weight_norm_sum(e->export_weights());
    else if (auto ok = e->gather_weights(); !ok)
      return ok.error();
    else
      out.norm_sums[static_cast<size_t>(r)] = -1; // not an exporter
    runtime::counting_allocator::set_thread_tag(-1);
    return {};
  };
  std::vector<std::future<expected<void>>> ranks;
  for (int r = 0; r < world; ++r)
    ranks.push_back(std::async(std::launch::async, rank_main, r));
  for (auto& f : ranks)
    if (auto ok = f.get(); !ok) {
      std::fprintf(stderr, "%s at %d ranks: %s\n", std::string{to_string(strategy)}.c_str(), world,
                   describe(ok.error()).c_str());
      std::exit(1);
    }
  median_bubble(passes, pp, tp, out);
  std::sort(times.begin(), times.end());
  out.step_s = times.empty() ? 0 : times[times.size() / 2];
  out.peak_bytes = *std::max_element(peaks.begin(), peaks.end());
  const auto timed = static_cast<double>(std::max<size_t>(1, global.size() - 1));
  out.received_per_step =
      static_cast<double>(received_after - received_before) / timed / static_cast<double>(world);
  return out;
}

// The bandwidth-optimal bytes a rank receives per step for Φ bytes of
// gradients (NOTE at the top).
double theory_bytes(dp_strategy s, int world, double phi) {
  const double ring = static_cast<double>(world - 1) / world * phi;
  return s == dp_strategy::zero3 ? 3 * ring : 2 * ring;
}

// zero3's own schedule (NOTE [zero3 units]): each layer gathered for forward
// and again for backward, the rest-unit (embeddings, final norm, head)
// gathered once and kept whole through backward, every gradient
// reduce-scattered: (N-1)/N (3 Φ_layers + 2 Φ_rest); the others as above.
double schedule_bytes(dp_strategy s, int world, double phi, double rest_share) {
  if (s != dp_strategy::zero3)
    return theory_bytes(s, world, phi);
  const double ring = static_cast<double>(world - 1) / world * phi;
  return ring * (3 * (1 - rest_share) + 2 * rest_share);
}

// Bus bandwidth of gloo's all-reduce of `bytes` over `world` in-process
// ranks (the median of `rounds`): the ring moves 2(N-1)/N of the buffer
// through each rank's link, so busbw = 2(N-1)/N · bytes / time (NCCL's
// convention).
double gloo_bus_bandwidth(int world, int64_t bytes, int rounds) {
  runtime::group_options go;
  go.name = "bench-busbw-" + std::to_string(world);
  go.timeout_ms = 120000;
  auto groups = runtime::make_local_groups(world, go);
  if (!groups) {
    std::fprintf(stderr, "%s\n", describe(groups.error()).c_str());
    std::exit(1);
  }
  std::vector<double> times;
  auto rank_main = [&](int r) {
    auto& g = groups->groups[static_cast<size_t>(r)];
    auto t = torch::ones({bytes / 4});
    for (int i = 0; i <= rounds; ++i) {
      (void)g.barrier();
      auto t0 = std::chrono::steady_clock::now();
      if (auto ok = g.all_reduce_sum(t); !ok)
        std::exit(1);
      if (r == 0 && i > 0) // the first is the warm-up
        times.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  };
  std::vector<std::future<void>> ranks;
  for (int r = 1; r < world; ++r)
    ranks.push_back(std::async(std::launch::async, rank_main, r));
  rank_main(0);
  for (auto& f : ranks)
    f.get();
  std::sort(times.begin(), times.end());
  const double n = world;
  return 2 * (n - 1) / n * static_cast<double>(bytes) / times[times.size() / 2];
}

// One loopback TCP stream between two threads of this process: `bytes` sent
// in 1 MiB writes and read to the end (the median of `rounds`), bytes / s.
double tcp_stream_bandwidth(int64_t bytes, int rounds) {
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listener, 1) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::perror("tcp stream");
    std::exit(1);
  }
  auto sender = std::async(std::launch::async, [&] {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
      std::exit(1);
    std::vector<char> chunk(1 << 20, 1);
    for (int i = 0; i <= rounds; ++i)
      for (int64_t sent = 0; sent < bytes;) {
        auto n = ::send(fd, chunk.data(),
                        static_cast<size_t>(std::min<int64_t>(bytes - sent, 1 << 20)), 0);
        if (n <= 0)
          std::exit(1);
        sent += n;
      }
    ::close(fd);
  });
  int fd = ::accept(listener, nullptr, nullptr);
  std::vector<char> buffer(1 << 20);
  std::vector<double> times;
  for (int i = 0; i <= rounds; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t got = 0; got < bytes;) {
      auto n = ::recv(fd, buffer.data(),
                      static_cast<size_t>(std::min<int64_t>(bytes - got, 1 << 20)), 0);
      if (n <= 0)
        std::exit(1);
      got += n;
    }
    if (i > 0)
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  sender.get();
  ::close(fd);
  ::close(listener);
  std::sort(times.begin(), times.end());
  return static_cast<double>(bytes) / times[times.size() / 2];
}

// NOTE [streamed publish]: two zero3 ranks export their weights to a
// receiver over the broadcast transport (1 MiB buckets), streamed and as
// a whole export then a publish, alternately; the median seconds of each.
void print_weight_sync(const models::llama_model& base, bool quick) {
  runtime::group_options go;
  go.name = "bench-sync-dp";
  go.timeout_ms = 120000;
  auto dp = runtime::make_local_groups(2, go);
  go.name = "bench-sync-bcast";
  auto wire = runtime::make_local_groups(2, go);
  if (!dp || !wire) {
    std::fprintf(stderr, "groups failed\n");
    std::exit(1);
  }
  std::vector<std::unique_ptr<actors::train::train_engine>> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.push_back(engine_of(base));
  std::vector<std::future<expected<void>>> joins;
  for (int r = 0; r < 2; ++r)
    joins.push_back(std::async(std::launch::async, [&, r] {
      auto g = std::make_shared<actors::train::data_parallel_group>();
      g->store = std::move(dp->stores[static_cast<size_t>(r)]);
      g->group = std::move(dp->groups[static_cast<size_t>(r)]);
      return ranks[static_cast<size_t>(r)]->join_data_parallel(g, {dp_strategy::zero3, 25});
    }));
  for (auto& j : joins)
    if (!j.get()) {
      std::fprintf(stderr, "join failed\n");
      std::exit(1);
    }
  runtime::transport_options o;
  o.kind = runtime::transport_kind::broadcast;
  o.channel = "bench-sync";
  o.bucket_bytes = 1 << 20;
  o.group = &wire->groups[0];
  auto root = runtime::make_weight_transport(o);
  o.group = &wire->groups[1];
  auto peer = runtime::make_weight_transport(o);
  if (!root || !peer) {
    std::fprintf(stderr, "transports failed\n");
    std::exit(1);
  }
  std::vector<double> streamed, whole;
  const int rounds = quick ? 2 : 6;
  for (int64_t v = 1; v <= 2 * rounds; ++v) {
    const bool stream = v % 2 == 1;
    auto other = std::async(std::launch::async, [&] { return ranks[1]->gather_weights(); });
    auto got = std::async(std::launch::async, [&] { return (*peer)->receive(v); });
    auto t0 = std::chrono::steady_clock::now();
    expected<void> ok;
    if (stream) {
      ok = (*root)->publish_streamed(
          v, ranks[0]->export_layout(),
          [&](const runtime::tensor_sink& put) { return ranks[0]->export_weights_to(put); });
    } else {
      ok = (*root)->publish(v, ranks[0]->export_weights());
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!ok || !other.get() || !got.get()) {
      std::fprintf(stderr, "weight sync %lld failed\n", static_cast<long long>(v));
      std::exit(1);
    }
    (stream ? streamed : whole).push_back(s);
  }
  std::sort(streamed.begin(), streamed.end());
  std::sort(whole.begin(), whole.end());
  const double a = streamed[streamed.size() / 2], b = whole[whole.size() / 2];
  std::printf("\nzero3 weight sync over broadcast (2 ranks, 1 MiB buckets): streamed %.1f ms, "
              "export then publish %.1f ms (%.2fx)\n",
              a * 1e3, b * 1e3, a / b);
}

// NOTE at the top: gloo's all-reduce against the raw stream, same process.
void print_bandwidths(bool quick) {
  const int64_t bytes = quick ? (int64_t{4} << 20) : (int64_t{64} << 20);
  const int rounds = quick ? 2 : 5;
  const double tcp = tcp_stream_bandwidth(bytes, rounds);
  std::printf("\nall-reduce of %lld MiB: raw loopback TCP stream %.2f GB/s\n",
              static_cast<long long>(bytes >> 20), tcp / 1e9);
  for (int world : {2, 4}) {
    const double bus = gloo_bus_bandwidth(world, bytes, rounds);
    std::printf("  gloo %d ranks: bus bandwidth %.2f GB/s (%.2f of the TCP stream)\n", world,
                bus / 1e9, bus / tcp);
  }
}

} // namespace

// NOTE [mixed precision]: each strategy at 2 ranks in bf16 against itself
// in fp32 — step time, peak memory (and the planner's bf16 figure), bytes
// received (bf16 gradients and weights: half) — and its weights against
// one bf16 engine's (the ranks sum bf16 gradients in another order: 1 %).
bool print_bf16(const models::llama_model& base, const std::vector<runtime::tensor_batch>& global,
                const options& o, int64_t rows) {
  const auto bf16 = actors::train::precision::bf16;
  auto single = engine_of(base, bf16);
  for (const auto& b : global)
    if (auto m = single->sft_step(b); !m) {
      std::fprintf(stderr, "%s\n", describe(m.error()).c_str());
      std::exit(1);
    }
  const double want = weight_norm_sum(single->export_weights());
  std::printf("\nbf16, 2 ranks (gloo), against the same strategy in fp32; single bf16 engine: "
              "weight-norm sum %.9g\n",
              want);
  std::printf("%-6s %-12s %8s %7s %12s %7s %9s %9s %12s %7s\n", "", "norm sum", "step ms",
              "vs fp32", "peak MiB/rk", "vs fp32", "plan MiB", "peak/plan", "recv/step/rk",
              "vs fp32");
  bool ok = true;
  for (auto s : {dp_strategy::ddp, dp_strategy::zero1, dp_strategy::zero2, dp_strategy::zero3}) {
    auto wide = run(base, global, 2, s), narrow = run(base, global, 2, s, bf16);
    bool close = true;
    for (double n : narrow.norm_sums)
      close = close && std::abs(n - want) <= 1e-2 * std::abs(want);
    ok = ok && close;
    const double plan =
        actors::train::training_rank_memory(
            s, 2, 25, actors::train::split_parameters(shape(o.quick), true),
            actors::train::activation_bytes(shape(o.quick), true, rows / 2, 64, bf16), bf16)
            .total();
    std::printf("%-6s %-12.9g %8.2f %7.2f %12.2f %7.2f %9.2f %9.3f %12.0f %7.2f%s\n",
                std::string{to_string(s)}.c_str(), narrow.norm_sums[0], narrow.step_s * 1e3,
                narrow.step_s / wide.step_s, static_cast<double>(narrow.peak_bytes) / (1 << 20),
                static_cast<double>(narrow.peak_bytes) / static_cast<double>(wide.peak_bytes),
                plan / (1 << 20), static_cast<double>(narrow.peak_bytes) / plan,
                narrow.received_per_step, narrow.received_per_step / wide.received_per_step,
                close ? "" : "  NORMS DIFFER (1 %)");
  }
  return ok;
}

// NOTE [tensor parallelism]: TP 2 and DP 2 × TP 2 against the single
// engine, TP 2's step time against DP 2's and the bytes a TP rank receives
// per step against Megatron's volume (at the top).
bool print_tensor_parallel(const models::llama_model& base,
                           const std::vector<runtime::tensor_batch>& global, const options& o,
                           int64_t rows, double want) {
  const auto c = shape(o.quick);
  const double H = static_cast<double>(c.hidden_size), L = static_cast<double>(c.num_hidden_layers);
  std::printf("\ntensor parallelism (gloo; single engine: weight-norm sum %.9g)\n", want);
  std::printf("%-12s %-12s %8s %9s %12s %12s %6s\n", "", "norm sum", "step ms", "vs dp 2",
              "recv/step/rk", "Megatron", "ratio");
  auto dp2 = run(base, global, 2, dp_strategy::ddp);
  bool ok = true;
  struct layout {
    const char* name;
    int world, tp;
  };
  for (const auto& l : {layout{"tp 2", 2, 2}, layout{"dp 2 x tp 2", 4, 2}}) {
    auto r = run(base, global, l.world, dp_strategy::ddp, actors::train::precision::fp32, l.tp);
    bool equal = true;
    for (double n : r.norm_sums)
      equal = equal && std::abs(n - want) <= 1e-5 * std::abs(want);
    ok = ok && equal;
    // Per rank and step: the tokens of its replica's share.
    const double tokens = static_cast<double>(rows * 64 / (l.world / l.tp));
    const double scored = static_cast<double>(rows * 63 / (l.world / l.tp)); // shifted rows
    const double activations = ((4 * L + 2) * tokens * H + 4 * scored) * 4;
    const double megatron = 2.0 * (l.tp - 1) / l.tp * activations;
    // The DP dimension's gradient all-reduce of a rank's parameters on top.
    const double dp_part =
        l.world > l.tp
            ? 2.0 * (l.world / l.tp - 1) / (l.world / l.tp) * 4 *
                  static_cast<double>(actors::train::split_parameters(c, true, l.tp).total())
            : 0.0;
    std::printf("%-12s %-12.9g %8.2f %9.2f %12.0f %12.0f %6.2f%s\n", l.name, r.norm_sums[0],
                r.step_s * 1e3, r.step_s / dp2.step_s, r.received_per_step, megatron + dp_part,
                r.received_per_step / (megatron + dp_part), equal ? "" : "  NORMS DIFFER");
  }
  std::printf("dp 2 (ddp)   %-12.9g %8.2f\n", dp2.norm_sums[0], dp2.step_s * 1e3);
  return ok;
}

// A pipeline hand-off's round trip between two ranks in this process:
// rank 0 sends `bytes` to rank 1, which sends them back, `trips` times;
// the median round trip in microseconds, over gloo or through shared memory
// (NOTE [shm point-to-point]).
double hand_off_round_trip_us(bool shm, int64_t bytes, int trips) {
  runtime::group_options go;
  go.name = std::string{"bench-hand-off-"} + (shm ? "shm" : "gloo");
  auto groups = runtime::make_local_groups(2, go);
  if (!groups)
    return -1;
  std::vector<double> rtts;
  auto rank = [&](int r) -> expected<void> {
    auto g = std::move(groups->groups[static_cast<size_t>(r)]);
    if (shm) {
      auto wrapped =
          runtime::with_shm_point_to_point(std::move(g), groups->stores[static_cast<size_t>(r)],
                                           go.name, actors::rl::pp_slot_bytes, 3);
      if (!wrapped)
        return wrapped.error();
      g = std::move(*wrapped);
    }
    auto t = torch::ones({bytes / 4});
    for (int i = 0; i < trips; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      if (r == 0) {
        if (auto ok = g.send(t, 1, 0); !ok)
          return ok;
        if (auto ok = g.recv(t, 1, 1); !ok)
          return ok;
        rtts.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 1e6);
      } else {
        if (auto ok = g.recv(t, 0, 0); !ok)
          return ok;
        if (auto ok = g.send(t, 0, 1); !ok)
          return ok;
      }
    }
    return {};
  };
  auto other = std::async(std::launch::async, rank, 1);
  auto mine = rank(0);
  auto theirs = other.get();
  if (!mine || !theirs || rtts.empty())
    return -1;
  std::sort(rtts.begin(), rtts.end());
  return rtts[rtts.size() / 2];
}

// NOTE [pipeline execution]: PP 2 against the single engine and DP 2 on a
// model of balanced stages (8 layers, a small vocabulary: the head adds
// little to the last stage), the measured bubble against (P − 1) / (M + P
// − 1) for M = 4, 8, 16, one compute thread a stage, the hand-offs over
// gloo and through shared memory (NOTE [shm point-to-point]); P = 4 on 2 cores would
// be oversubscribed, so its bubble comes from the schedule fed with the
// stage times measured at P = 2 (each stage's halved: half the layers).
bool print_pipeline(const options& o) {
  auto c = shape(o.quick);
  c.num_hidden_layers = o.quick ? 4 : 8;
  c.vocab_size = 512;
  torch::manual_seed(13);
  auto base = models::make_llama(c, models::head_kind::lm);
  if (!base) {
    std::fprintf(stderr, "%s\n", describe(base.error()).c_str());
    return false;
  }
  const int64_t rows = 16;
  auto global = batches(o.steps + 1, rows, c.vocab_size);
  auto single = engine_of(*base);
  for (const auto& b : global)
    if (!single->sft_step(b))
      return false;
  const double want = weight_norm_sum(single->export_weights());
  std::printf("\npipeline parallelism (hand-offs over gloo or shared memory, %lld layers, %lld "
              "rows x 64 tokens; single engine: "
              "weight-norm sum %.9g)\n",
              static_cast<long long>(c.num_hidden_layers), static_cast<long long>(rows), want);
  std::printf("%-20s %-12s %8s %9s %9s %9s %7s %9s %9s %12s\n", "", "norm sum", "step ms",
              "vs dp 2", "bubble", "ideal", "ratio", "critical", "schedule", "stage ms/mb");
  auto dp2 = run(*base, global, 2, dp_strategy::ddp);
  bool ok = true;
  std::vector<double> stage_times; // P = 2, M = 16: each stage's busy time a micro-batch
  for (int64_t m : {4, 8, 16})
    for (bool shm : {false, true}) { // hand-offs over gloo, then through shared memory
      auto r =
          run(*base, global, 2, dp_strategy::ddp, actors::train::precision::fp32, 1, 2, m, shm);
      bool equal = true;
      for (double n : r.norm_sums)
        equal = equal && (n < 0 || std::abs(n - want) <= 1e-5 * std::abs(want));
      ok = ok && equal;
      const double ideal = runtime::ideal_bubble(2, static_cast<int>(m));
      // The schedule fed with this run's stage times (a micro-batch's busy
      // time, the backward taken as twice the forward): the bubble the
      // stages' imbalance alone leaves.
      std::vector<double> f, b;
      std::string per;
      for (double busy : r.stage_busy_s) {
        const double t = busy / static_cast<double>(m);
        f.push_back(t / 3);
        b.push_back(2 * t / 3);
        char x[32];
        std::snprintf(x, sizeof x, "%s%.2f", per.empty() ? "" : " / ", t * 1e3);
        per += x;
      }
      auto grid = runtime::one_f_one_b(2, static_cast<int>(m));
      auto sim =
          grid && f.size() == 2
              ? runtime::simulate(*grid, f, b)
              : expected<runtime::pipe_timeline>{make_error(errc::internal, "no stage times")};
      std::printf("%-20s %-12.9g %8.2f %9.2f %8.1f%% %8.1f%% %7.2f %8.1f%% %8.1f%% %12s%s\n",
                  ("pp 2, M " + std::to_string(m) + (shm ? ", shm" : ", gloo")).c_str(),
                  r.norm_sums[0], r.step_s * 1e3, r.step_s / dp2.step_s, 100 * r.bubble,
                  100 * ideal, r.bubble / ideal, 100 * r.critical, sim ? 100 * sim->bubble : 0.0,
                  per.c_str(), equal ? "" : "  NORMS DIFFER");
      if (m == 16 && shm)
        for (double busy : r.stage_busy_s)
          stage_times.push_back(busy / static_cast<double>(m));
    }
  std::printf("%-20s %-12.9g %8.2f\n", "dp 2 (ddp)", dp2.norm_sums[0], dp2.step_s * 1e3);
  // The hand-off itself: an M = 8 micro-batch's hidden states (2 rows x 64
  // tokens x hidden), there and back.
  const int64_t hand_off = 2 * 64 * c.hidden_size * 4;
  std::printf("hand-off round trip (%lld KB, median of 200): gloo %.0f us, shared memory %.0f us\n",
              static_cast<long long>(hand_off / 1024), hand_off_round_trip_us(false, hand_off, 200),
              hand_off_round_trip_us(true, hand_off, 200));
  // P = 4 from the schedule: stage s of 4 is half of stage s / 2 of 2 (the
  // backward taken as twice the forward).
  for (int64_t m : {4, 8, 16}) {
    std::vector<double> f, b;
    for (int s = 0; s < 4 && stage_times.size() == 2; ++s) {
      const double per = stage_times[static_cast<size_t>(s / 2)] / 2;
      f.push_back(per / 3);
      b.push_back(2 * per / 3);
    }
    auto grid = runtime::one_f_one_b(4, static_cast<int>(m));
    auto t = grid && f.size() == 4
                 ? runtime::simulate(*grid, f, b)
                 : expected<runtime::pipe_timeline>{make_error(errc::internal, "no stage times")};
    if (!t)
      continue;
    const double ideal = runtime::ideal_bubble(4, static_cast<int>(m));
    std::printf("%-20s %-12s %8s %9s %8.1f%% %8.1f%% %7.2f  (simulated from measured stage "
                "times)\n",
                ("pp 4, M " + std::to_string(m)).c_str(), "", "", "", 100 * t->bubble, 100 * ideal,
                t->bubble / ideal);
  }
  return ok;
}

int main(int argc, char** argv) {
  const auto o = parse(argc, argv);
  at::set_num_threads(1);
  if (o.pipeline_only)
    return print_pipeline(o) ? 0 : 1;
  torch::manual_seed(11);
  auto base = models::make_llama(shape(o.quick), models::head_kind::lm);
  if (!base) {
    std::fprintf(stderr, "%s\n", describe(base.error()).c_str());
    return 1;
  }
  int64_t params = 0;
  for (const auto& p : (*base)->parameters())
    params += p.numel();
  const int64_t rows = 8;
  auto global = batches(o.steps + 1, rows, shape(o.quick).vocab_size);
  const double tokens = static_cast<double>(rows * 64);

  // One engine on the whole batches: the answer.
  auto single = engine_of(*base);
  for (const auto& b : global)
    if (auto m = single->sft_step(b); !m) {
      std::fprintf(stderr, "%s\n", describe(m.error()).c_str());
      return 1;
    }
  const double want = weight_norm_sum(single->export_weights());

  std::printf("strategy harness: %lld parameters (%.1f MB fp32), global batch %lld rows x 64 "
              "tokens, %d timed steps, 1 compute thread a rank\n",
              static_cast<long long>(params), static_cast<double>(params) * 4 / 1e6,
              static_cast<long long>(rows), o.steps);
  std::printf("single engine: weight-norm sum %.9g\n", want);
  bool all_ok = true;
  for (int world : {2, 4}) {
    std::printf("\n%d ranks (gloo)\n", world);
    std::printf("%-6s %-12s %8s %7s %9s %12s %7s %9s %9s %12s %12s %6s %12s\n", "", "norm sum",
                "step ms", "vs ddp", "tokens/s", "peak MiB/rk", "vs ddp", "plan MiB", "peak/plan",
                "recv/step/rk", "optimal", "ratio", "vs schedule");
    double ddp_time = 0, ddp_peak = 0;
    for (auto s : {dp_strategy::ddp, dp_strategy::zero1, dp_strategy::zero2, dp_strategy::zero3}) {
      auto r = run(*base, global, world, s);
      bool equal = true;
      for (double n : r.norm_sums)
        equal = equal && std::abs(n - want) <= 1e-5 * std::abs(want);
      all_ok = all_ok && equal;
      if (s == dp_strategy::ddp) {
        ddp_time = r.step_s;
        ddp_peak = static_cast<double>(r.peak_bytes);
      }
      // NOTE [rank memory]: the planner's peak for this rank's share.
      const double plan =
          actors::train::training_rank_memory(
              s, world, 25, actors::train::split_parameters(shape(o.quick), true),
              actors::train::activation_bytes(shape(o.quick), true, rows / world, 64))
              .total();
      const double optimal = theory_bytes(s, world, 4.0 * static_cast<double>(params));
      const auto split = actors::train::split_parameters(shape(o.quick), true);
      const double schedule =
          schedule_bytes(s, world, 4.0 * static_cast<double>(params),
                         static_cast<double>(split.rest) / static_cast<double>(split.total()));
      std::printf(
          "%-6s %-12.9g %8.2f %7.2f %9.0f %12.2f %7.2f %9.2f %9.3f %12.0f %12.0f %6.2f %12.2f%s\n",
          std::string{to_string(s)}.c_str(), r.norm_sums[0], r.step_s * 1e3, r.step_s / ddp_time,
          tokens / r.step_s, static_cast<double>(r.peak_bytes) / (1 << 20),
          static_cast<double>(r.peak_bytes) / ddp_peak, plan / (1 << 20),
          static_cast<double>(r.peak_bytes) / plan, r.received_per_step, optimal,
          r.received_per_step / optimal, r.received_per_step / schedule,
          equal ? "" : "  NORMS DIFFER");
    }
  }
  all_ok = print_bf16(*base, global, o, rows) && all_ok;
  all_ok = print_tensor_parallel(*base, global, o, rows, want) && all_ok;
  all_ok = print_pipeline(o) && all_ok;
  print_weight_sync(*base, o.quick);
  print_bandwidths(o.quick);
  std::printf("\n%s\n", all_ok ? "every rank of every strategy matches the single engine (1e-5)"
                               : "MISMATCH: a strategy's weights differ from the single engine's");
  return all_ok ? 0 : 1;
}
