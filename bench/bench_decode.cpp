// CPU decode (issues 19, 28): the fused kernel (NOTE [fused decode] in
// kernels/cpu/fused_decode.hpp) on every instruction-set path this machine
// runs (NOTE [decode isa]), side by side with the per-operator ATen path
// (which reaches OpenBLAS through at::mm) and with a naive C decoder
// (bench/naive_decoder.h) on the same weights, in one run.
//
//  - The read limit: the larger of a multi-stream read (bench/stream_read.h)
//    and the naive decoder's bytes per second, at 1 and 2 threads.
//  - Batch 1: each path's model step against ATen and the naive decoder, and
//    the bytes of weights it reads per second against the limit.
//  - The sweep: model steps of batch 1 … 64 at 1 and 2 threads, fused from
//    packed panels, fused from the stored rows, ATen, and the default (auto)
//    choice; the crossover points the table in kernels/cpu/decode_isa.cpp
//    records (NOTE [decode crossovers]).
//  - The engine: `troupe generate`'s loop (sampling included) at batch 1 and
//    32, the default against decode_panels on and off.
// Every figure is the median of `rounds` rounds that run all the cases of a
// comparison in an order that alternates from round to round (the machine is
// shared and noisy; ratios compare runs taken together).
//
//  - The command line: `troupe generate -n 32 --max-tokens 64 --temperature 1
//    --ignore-eos --threads 2` on the shape saved as a model directory, against
//    `-n 1`, with --decode-panels auto, on and off (the figure users see).
//
// Usage: bench_decode [--isa all|auto|avx512|avx2|baseline] [--shape 15m|24m|both]
//                     [--rounds N] [--no-sweep] [--no-engine] [--no-cli]
#include "actors/inference/engine.hpp"
#include "bench/llama_shapes.hpp"
#include "bench/naive_decoder.h"
#include "bench/stream_read.h"
#include "kernels/cpu/decode_isa.hpp"
#include "models/llama.hpp"

#include <torch/torch.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

using namespace troupe;
using namespace troupe::actors::inference;
using kernels::cpu::decode_isa;
using kernels::cpu::decode_path;
using clock_type = std::chrono::steady_clock;

namespace {

struct options {
  std::vector<decode_isa> isas;
  std::vector<bool> tied{false};
  int rounds = 5;
  bool sweep = true, engine = true, cli = true;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "bench_decode: %s\nusage: bench_decode [--isa all|auto|avx512|avx2|baseline] "
               "[--shape 15m|24m|both] [--rounds N] [--no-sweep] [--no-engine] [--no-cli]\n",
               why);
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  std::string isa = "all";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc)
        usage(("missing a value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--isa")
      isa = value();
    else if (a == "--shape") {
      auto s = value();
      if (s == "15m")
        o.tied = {true};
      else if (s == "24m")
        o.tied = {false};
      else if (s == "both")
        o.tied = {true, false};
      else
        usage(("--shape: expected 15m, 24m or both, got " + s).c_str());
    } else if (a == "--rounds")
      o.rounds = std::max(1, std::atoi(value().c_str()));
    else if (a == "--no-sweep")
      o.sweep = false;
    else if (a == "--no-engine")
      o.engine = false;
    else if (a == "--no-cli")
      o.cli = false;
    else
      usage(("unknown argument " + a).c_str());
  }
  if (isa == "all")
    o.isas = kernels::cpu::supported_decode_isas();
  else if (auto named = enum_from_name<decode_isa>(isa)) {
    if (auto why = kernels::cpu::unsupported_why(*named); !why.empty())
      usage(("--isa " + why).c_str());
    o.isas = {kernels::cpu::resolve(*named)};
  } else
    usage(
        ("--isa: expected all or one of " + enum_name_list<decode_isa>() + ", got " + isa).c_str());
  return o;
}

std::string cpu_model() {
  std::ifstream in{"/proc/cpuinfo"};
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0)
      return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Runs every case `rounds` times, forwards and backwards in turn, and
// returns each case's median seconds.
std::vector<double> interleaved(const std::vector<std::function<double()>>& cases, int rounds) {
  std::vector<std::vector<double>> times(cases.size());
  for (int r = 0; r < rounds; ++r)
    for (size_t i = 0; i < cases.size(); ++i) {
      auto c = r % 2 == 0 ? i : cases.size() - 1 - i;
      times[c].push_back(cases[c]());
    }
  std::vector<double> out;
  for (auto& t : times)
    out.push_back(median(t));
  return out;
}

// Seconds per call of fn: calls for 30 ms to warm up (a packed copy made,
// its pages touched and settled), then calls until 60 ms have passed (at
// least 3).
double per_call(const std::function<void()>& fn) {
  for (auto w0 = clock_type::now();
       std::chrono::duration<double>(clock_type::now() - w0).count() < 0.03;)
    fn();
  int calls = 0;
  auto t0 = clock_type::now();
  double dt = 0;
  while (calls < 3 || dt < 0.06) {
    fn();
    ++calls;
    dt = std::chrono::duration<double>(clock_type::now() - t0).count();
  }
  return dt / calls;
}

// ---- the read limit -------------------------------------------------------------------

// The best multi-stream read (GB/s) of `threads` threads over a 256 MiB
// buffer: 1, 2, 4 and 8 streams a thread, without and with prefetching 1 or
// 4 KiB ahead, best of 3 passes each.
double stream_limit(int threads) {
  static std::vector<float> buf((256u << 20) / sizeof(float), 1.0f);
  double best = 0;
  for (int streams : {1, 2, 4, 8})
    for (int prefetch : {0, 4, 16})
      for (int pass = 0; pass < 3; ++pass)
        best = std::max(best, stream_read_gbps(buf.data(), buf.size(), threads, streams, prefetch));
  return best;
}

// ---- the naive C decoder --------------------------------------------------------------

// The naive decoder over a model's weights (pointers into its tensors).
struct naive {
  std::vector<std::vector<const float*>> per_layer; // 9 arrays of one pointer per layer
  std::vector<float> inv_freq;
  naive_decoder* d = nullptr;

  explicit naive(models::llama_model& m) {
    const auto& c = m->config();
    auto w = m->named_weights();
    auto ptr = [&](const std::string& name) -> const float* {
      return w.at(name).data_ptr<float>();
    };
    const char* names[] = {"attention_norm",  "attention.wq",    "attention.wk",
                           "attention.wv",    "attention.wo",    "ffn_norm",
                           "feed_forward.w1", "feed_forward.w3", "feed_forward.w2"};
    per_layer.resize(9);
    for (int k = 0; k < 9; ++k)
      for (int64_t l = 0; l < c.num_hidden_layers; ++l)
        per_layer[static_cast<size_t>(k)].push_back(
            ptr("layers." + std::to_string(l) + "." + names[k] + ".weight"));
    for (double f : models::rope_inv_freq(c))
      inv_freq.push_back(static_cast<float>(f));
    naive_config nc{static_cast<int>(c.hidden_size),
                    static_cast<int>(c.intermediate_size),
                    static_cast<int>(c.num_hidden_layers),
                    static_cast<int>(c.num_attention_heads),
                    static_cast<int>(c.num_key_value_heads),
                    static_cast<int>(c.vocab_size),
                    static_cast<int>(c.max_position_embeddings),
                    static_cast<float>(c.rms_norm_eps)};
    naive_weights nw{ptr("tok_embeddings.weight"),
                     per_layer[0].data(),
                     per_layer[1].data(),
                     per_layer[2].data(),
                     per_layer[3].data(),
                     per_layer[4].data(),
                     per_layer[5].data(),
                     per_layer[6].data(),
                     per_layer[7].data(),
                     per_layer[8].data(),
                     ptr("norm.weight"),
                     c.tie_word_embeddings ? ptr("tok_embeddings.weight") : ptr("output.weight"),
                     inv_freq.data()};
    d = naive_new(&nc, &nw);
  }
  ~naive() { naive_free(d); }
  naive(const naive&) = delete;
  naive& operator=(const naive&) = delete;
};

// The largest difference between the naive decoder's logits and the model's
// over a short sequence (both must compute the same function).
float naive_disagreement(models::llama_model& m, naive& n) {
  std::vector<int64_t> ids{1, 450, 4996, 17354, 1701, 432, 17204, 975};
  torch::NoGradGuard no_grad;
  auto t = torch::tensor(ids).view({1, -1});
  auto want = m->forward(t, torch::ones_like(t))[0];
  float worst = 0;
  for (size_t p = 0; p < ids.size(); ++p) {
    const float* got = naive_forward(n.d, static_cast<int>(ids[p]), static_cast<int>(p), 1);
    auto row = want[static_cast<int64_t>(p)].contiguous();
    const float* w = row.data_ptr<float>();
    for (int64_t v = 0; v < row.numel(); ++v)
      worst = std::max(worst, std::abs(got[v] - w[v]));
  }
  return worst;
}

// ---- model steps -----------------------------------------------------------------------

// A decode step of `batch` requests, each one token at position 100, and
// the pools it reads (the model step alone: no scheduling, no sampling).
struct step_input {
  models::paged_kv_cache cache;
  models::paged_batch b;
  step_input(models::llama_model& m, int64_t batch) : cache(m->make_paged_cache(16 * batch, 16)) {
    auto i64 = torch::TensorOptions().dtype(torch::kInt64);
    b.input_ids = torch::full({batch}, 7, i64);
    b.positions = torch::full({batch}, 100, i64);
    b.slot_mapping = torch::arange(batch, i64) * 256 + 100;
    b.block_tables = torch::arange(16 * batch, torch::kInt32).view({batch, 16});
    b.context_lens = torch::full({batch}, 101, i64);
    b.query_start = torch::arange(batch + 1, i64);
  }
};

// How a case runs the model's decode steps.
struct way {
  const char* name;
  decode_path path;
  kernels::cpu::panels_mode panels;
};
const way kPanels{"panels", decode_path::fused, kernels::cpu::panels_mode::on};
const way kRows{"rows", decode_path::fused, kernels::cpu::panels_mode::off};
const way kAten{"ATen", decode_path::aten, kernels::cpu::panels_mode::off};
const way kAuto{"auto", decode_path::automatic, kernels::cpu::panels_mode::automatic};

std::function<double()> model_case(models::llama_model& m, step_input& in, decode_isa isa, way w,
                                   int threads) {
  return [&m, &in, isa, w, threads] {
    at::set_num_threads(threads);
    m->set_decode_isa(isa);
    m->set_decode_path(w.path);
    m->set_decode_panels(w.panels);
    return per_call([&] { m->forward_paged(in.b, in.cache); });
  };
}

struct shape_info {
  bool tied;
  double bytes; // of weights read per token
};

// ---- batch 1 -------------------------------------------------------------------------------

void batch_one(models::llama_model& m, const shape_info& s, const options& o,
               const double (&stream)[3]) {
  naive n{m};
  std::printf("  naive C decoder agrees with the model to %.2g (max |logit difference|)\n",
              naive_disagreement(m, n));
  step_input in{m, 1};
  for (int threads : {1, 2}) {
    // The naive decoder at position 100 (its cache holds 0..99 from a warm-up).
    for (int p = 0; p < 100; ++p)
      naive_forward(n.d, 7, p, threads);
    std::vector<std::function<double()>> cases;
    cases.push_back(
        [&n, threads] { return per_call([&] { naive_forward(n.d, 7, 100, threads); }); });
    cases.push_back(model_case(m, in, decode_isa::automatic, kAten, threads));
    for (auto isa : o.isas)
      cases.push_back(model_case(m, in, isa, kRows, threads));
    auto t = interleaved(cases, o.rounds);
    const double naive_gbps = s.bytes / t[0] / 1e9;
    const double limit = std::max(stream[threads], naive_gbps);
    std::printf("  batch 1, %d thread%s: read limit %.2f GB/s (streams %.2f, naive %.2f); naive "
                "%.0f tokens/s, ATen %.0f tokens/s\n",
                threads, threads == 1 ? " " : "s", limit, stream[threads], naive_gbps, 1 / t[0],
                1 / t[1]);
    for (size_t i = 0; i < o.isas.size(); ++i) {
      double sec = t[2 + i], gbps = s.bytes / sec / 1e9;
      std::printf("    %-8s fused %.0f tokens/s = %.2fx ATen, %.2fx naive; reads %.2f GB/s = "
                  "%.0f%% of the limit\n",
                  std::string{to_string(o.isas[i])}.c_str(), 1 / sec, t[1] / sec, t[0] / sec, gbps,
                  100 * gbps / limit);
    }
  }
}

// ---- the sweep -----------------------------------------------------------------------------

void sweep(models::llama_model& m, const options& o) {
  const std::vector<int64_t> batches{1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64};
  std::map<int64_t, std::unique_ptr<step_input>> inputs;
  for (auto b : batches)
    inputs[b] = std::make_unique<step_input>(m, b);
  for (auto isa : o.isas) {
    const auto& table = kernels::cpu::crossover(isa);
    std::printf("\n  sweep, %s path (tokens/s of the model step; table: panels from batch %lld, "
                "rows again from %lld, ATen from %lld)\n",
                std::string{to_string(isa)}.c_str(), static_cast<long long>(table.panels_from),
                static_cast<long long>(table.rows_from), static_cast<long long>(table.aten_from));
    std::printf("    %5s %3s %10s %10s %10s %10s %8s %8s\n", "batch", "thr", "panels", "rows",
                "ATen", "auto", "best/ATen", "auto/ATen");
    for (int threads : {1, 2}) {
      int64_t panels_win = 0, rows_win = 0, aten_win = 0;
      for (auto b : batches) {
        auto& in = *inputs[b];
        std::vector<std::function<double()>> cases;
        for (const auto& w : {kPanels, kRows, kAten, kAuto})
          cases.push_back(model_case(m, in, isa, w, threads));
        auto t = interleaved(cases, o.rounds);
        auto rate = [&](double sec) { return static_cast<double>(b) / sec; };
        double best_fused = std::min(t[0], t[1]);
        if (b > 1 && t[0] < t[1] && panels_win == 0)
          panels_win = b;
        if (panels_win != 0 && t[1] < t[0] && rows_win == 0)
          rows_win = b;
        if (best_fused > t[2] && aten_win == 0)
          aten_win = b;
        std::printf("    %5lld %3d %10.0f %10.0f %10.0f %10.0f %8.2f %8.2f\n",
                    static_cast<long long>(b), threads, rate(t[0]), rate(t[1]), rate(t[2]),
                    rate(t[3]), t[2] / best_fused, t[2] / t[3]);
      }
      std::printf("    %d thread%s: panels first beat rows at batch %lld, rows beat them again "
                  "at %lld; ATen first beats the fused kernel at %lld (0: never)\n",
                  threads, threads == 1 ? "" : "s", static_cast<long long>(panels_win),
                  static_cast<long long>(rows_win), static_cast<long long>(aten_win));
    }
  }
  m->set_decode_path(decode_path::automatic);
  m->set_decode_panels(kernels::cpu::panels_mode::automatic);
}

// ---- the engine ---------------------------------------------------------------------------

// Generated tokens per second of `batch` sampled requests of 64 tokens each
// after a 16-token prompt (decode steps only: the first token comes with
// the prefill and is left out).
double engine_rate(models::llama_model& m, kernels::cpu::panels_mode panels, int batch, int salt) {
  engine_config c;
  c.num_blocks = 2048;
  c.max_num_seqs = 64;
  c.max_batched_tokens = 4096;
  c.decode_panels = panels;
  auto e = engine::make(m, c);
  if (!e)
    usage(describe(e.error()).c_str());
  std::vector<generate_request> reqs;
  for (int r = 0; r < batch; ++r) {
    generate_request q;
    q.id = std::to_string(r);
    for (int i = 0; i < 16; ++i)
      q.prompt.push_back((i * 7919 + (r + salt) * 104729) % 32000);
    q.sampling.temperature = 1;
    q.sampling.seed = static_cast<uint64_t>(r + 1);
    q.sampling.max_tokens = 64;
    q.sampling.ignore_eos = true;
    reqs.push_back(std::move(q));
  }
  (*e)->generate(reqs); // warm: pages, the packed copy
  auto t0 = clock_type::now();
  auto outs = (*e)->generate(std::move(reqs));
  double wall = std::chrono::duration<double>(clock_type::now() - t0).count();
  if (!outs)
    usage(describe(outs.error()).c_str());
  double ttft = (*e)->metrics().mean_ttft_ms() / 1000.0;
  return static_cast<double>(batch) * 63 / std::max(1e-9, wall - ttft);
}

void engine_figures(models::llama_model& m, const options& o) {
  using kernels::cpu::panels_mode;
  at::set_num_threads(2);
  m->set_decode_isa(decode_isa::automatic);
  m->set_decode_path(decode_path::automatic);
  std::printf("\n  engine (sampling included), 2 threads, the auto path, 64 tokens per request:\n");
  double one = 0;
  for (int batch : {1, 32}) {
    int salt = 0;
    std::vector<std::function<double()>> cases;
    for (auto p : {panels_mode::automatic, panels_mode::on, panels_mode::off})
      cases.push_back([&m, p, batch, &salt] { return 1 / engine_rate(m, p, batch, salt++); });
    auto t = interleaved(cases, o.rounds);
    if (batch == 1)
      one = 1 / t[0];
    std::printf("    batch %2d: default %.0f tokens/s, panels on %.0f, off %.0f; default / best "
                "%.2fx%s\n",
                batch, 1 / t[0], 1 / t[1], 1 / t[2], std::min(t[1], t[2]) / t[0],
                batch > 1 ? (" ; batch " + std::to_string(batch) +
                             " / batch 1 = " + std::to_string(1 / t[0] / one).substr(0, 4) + "x")
                                .c_str()
                          : "");
  }
}

// ---- the command line ---------------------------------------------------------------------

// The tokens/s `troupe generate` reports (its metrics line on stderr) for
// `args` after the model directory; the process runs without a shell.
double generate_rate(const std::string& model_dir, const std::string& log,
                     const std::vector<std::string>& args) {
  std::vector<std::string> argv{TROUPE_BINARY_PATH, "generate", "--model", model_dir};
  argv.insert(argv.end(), args.begin(), args.end());
  pid_t pid = fork();
  if (pid == 0) {
    int out = open("/dev/null", O_WRONLY),
        err = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(out, 1);
    dup2(err, 2);
    std::vector<char*> raw;
    for (auto& a : argv)
      raw.push_back(a.data());
    raw.push_back(nullptr);
    execv(raw[0], raw.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  std::ifstream in{log};
  std::string text{std::istreambuf_iterator<char>{in}, {}};
  auto at = text.find(" tokens/s");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || at == std::string::npos)
    usage(("troupe generate failed: " + text).c_str());
  auto from = text.rfind(' ', at - 1) + 1;
  return std::stod(text.substr(from, at - from));
}

void cli_figures(models::llama_model& m, const options& o) {
  auto dir = std::filesystem::temp_directory_path() / ("bench_decode." + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  if (auto saved = models::save_pretrained(m, (dir / "model").string()); !saved)
    usage(describe(saved.error()).c_str());
  const auto model = (dir / "model").string(), log = (dir / "log").string();
  std::printf("\n  troupe generate --prompt 'Once upon a time' --max-tokens 64 --temperature 1 "
              "--ignore-eos --threads 2 (the byte tokenizer; tokens/s it reports):\n");
  auto run = [&](int n, const char* panels) {
    return generate_rate(model, log,
                         {"--prompt", "Once upon a time", "-n", std::to_string(n), "--max-tokens",
                          "64", "--temperature", "1", "--ignore-eos", "--threads", "2",
                          "--decode-panels", panels, "--seed", "1"});
  };
  std::vector<std::function<double()>> cases;
  for (int n : {1, 32})
    for (const char* p : {"auto", "on", "off"})
      cases.push_back([&run, n, p] { return 1 / run(n, p); });
  auto t = interleaved(cases, o.rounds);
  for (int i = 0; i < 2; ++i)
    std::printf("    -n %2d: auto %.0f tokens/s, on %.0f, off %.0f; auto / best %.2fx\n",
                i == 0 ? 1 : 32, 1 / t[3 * i], 1 / t[3 * i + 1], 1 / t[3 * i + 2],
                std::min(t[3 * i + 1], t[3 * i + 2]) / t[3 * i]);
  std::printf("    -n 32 / -n 1 (auto): %.2fx\n", t[0] / t[3]);
  std::filesystem::remove_all(dir);
}

} // namespace

int main(int argc, char** argv) {
  auto o = parse(argc, argv);
  std::printf("machine: %s, %u hardware threads; paths it runs:", cpu_model().c_str(),
              std::thread::hardware_concurrency());
  for (auto isa : kernels::cpu::supported_decode_isas())
    std::printf(" %s", std::string{to_string(isa)}.c_str());
  std::printf("; auto picks %s\n", std::string{to_string(kernels::cpu::best_decode_isa())}.c_str());
  std::printf("%d interleaved rounds, medians\n", o.rounds);
  const double stream[3] = {0, stream_limit(1), stream_limit(2)};
  std::printf("multi-stream read: %.2f GB/s (1 thread), %.2f GB/s (2 threads)\n", stream[1],
              stream[2]);
  for (bool tied : o.tied) {
    torch::manual_seed(1);
    auto model = models::make_llama(bench::llama_shape(tied), models::head_kind::lm);
    if (!model)
      return 1;
    auto m = *model;
    m->eval();
    int64_t params = 0;
    for (const auto& p : m->parameters())
      params += p.numel();
    // Every weight is read once per token except an untied embedding
    // table, of which one row is.
    auto c = bench::llama_shape(tied);
    auto table = c.vocab_size * c.hidden_size;
    shape_info s{tied, 4.0 * static_cast<double>(tied ? params : params - table + c.hidden_size)};
    std::printf("\n%.1fM parameters (%s embeddings), %.1f MB of them read per token\n",
                params / 1e6, tied ? "tied" : "untied", s.bytes / 1e6);
    batch_one(m, s, o, stream);
    if (o.sweep)
      sweep(m, o);
    if (o.engine)
      engine_figures(m, o);
    if (o.cli)
      cli_figures(m, o);
  }
  return 0;
}
