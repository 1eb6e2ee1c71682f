#include "actors/weight_channel.hpp"

#include "runtime/collectives.hpp"

namespace troupe::actors {

runtime::transport_options transport_options_of(const weight_channel& c) {
  runtime::transport_options o;
  o.kind = c.kind;
  o.channel = c.channel;
  o.dir = c.dir;
  o.keep = static_cast<int>(c.keep);
  o.timeout_ms = c.timeout_ms;
  return o;
}

namespace {

struct channel_group {
  runtime::store store;
  runtime::process_group group;
};

} // namespace

expected<runtime::weight_transport*> open_channel(transport_cache& cache, const weight_channel& c,
                                                  channel_side side) {
  auto key = std::string{to_string(c.kind)} + "/" + c.channel;
  auto it = cache.transports.find(key);
  if (it != cache.transports.end())
    return it->second.get();
  auto options = transport_options_of(c);
  if (runtime::traits_of(c.kind).needs_group) {
    auto st = runtime::connect_tcp_store(c.store, c.timeout_ms);
    if (!st)
      return with_prefix(st.error(), "weight channel " + c.channel);
    auto g = std::make_shared<channel_group>();
    g->store = std::move(*st);
    runtime::group_options go;
    go.rank = static_cast<int>(side);
    go.world_size = 2;
    go.interface_host = side == channel_side::publisher ? c.publisher_host : c.receiver_host;
    go.name = c.channel;
    go.timeout_ms = c.timeout_ms;
    auto pg = runtime::make_process_group(g->store, go);
    if (!pg)
      return with_prefix(pg.error(), "weight channel " + c.channel);
    g->group = std::move(*pg);
    options.group = &g->group;
    options.root = 0;
    cache.groups[key] = g;
  }
  auto t = runtime::make_weight_transport(options);
  if (!t)
    return t.error();
  return cache.transports.emplace(key, std::move(*t)).first->second.get();
}

} // namespace troupe::actors
