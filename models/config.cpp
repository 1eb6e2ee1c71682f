#include "models/config.hpp"

#include "kernels/cpu/fused_decode.hpp"
#include "runtime/file_io.hpp"
#include "runtime/jsonl.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

namespace troupe::models {

namespace {

using json = nlohmann::json;

// A supported model family; `default_*` are HF transformers' defaults for
// keys a config.json may omit.
struct arch_info {
  const char* family; // architecture names are family + one of head_suffixes
  const char* model_type;
  int64_t default_max_position_embeddings;
  double default_rms_norm_eps;
};

constexpr arch_info archs[] = {
    {"Llama", "llama", 2048, 1e-6},
    {"Qwen2", "qwen2", 32768, 1e-6},
    {"Mistral", "mistral", 131072, 1e-6},
};

// LM head, scalar reward head, per-token value head.
constexpr const char* head_suffixes[] = {"ForCausalLM", "ForSequenceClassification",
                                         "ForTokenClassification"};

const arch_info* find_arch(std::string_view architecture) {
  for (const auto& a : archs) {
    std::string_view family{a.family};
    if (architecture.substr(0, family.size()) != family)
      continue;
    for (const char* suffix : head_suffixes)
      if (architecture.substr(family.size()) == suffix)
        return &a;
  }
  return nullptr;
}

bool is_family(const llama_config& c, std::string_view model_type) {
  const auto* a = find_arch(c.architecture);
  return a != nullptr && model_type == a->model_type;
}

bool is_causal_lm(const std::string& architecture) {
  static constexpr std::string_view suffix = "ForCausalLM";
  return architecture.size() >= suffix.size() &&
         architecture.compare(architecture.size() - suffix.size(), suffix.size(), suffix) == 0;
}

const arch_info* find_model_type(std::string_view model_type) {
  for (const auto& a : archs)
    if (model_type == a.model_type)
      return &a;
  return nullptr;
}

std::string supported_architectures() {
  std::string out;
  for (const auto& a : archs) {
    if (!out.empty())
      out += ", ";
    out += std::string{a.family} + "For{CausalLM,SequenceClassification,TokenClassification}";
  }
  return out;
}

bool known_dtype(std::string_view d) {
  return d == "float32" || d == "float16" || d == "bfloat16";
}

using runtime::json_type_name;

// Typed access to the keys of one JSON object; the first failure is kept.
class key_reader {
public:
  key_reader(const json& obj, std::string prefix) : obj_(obj), prefix_(std::move(prefix)) {}

  const caf::error& error() const { return err_; }
  bool ok() const { return !err_; }

  /// The value of `key`, or nullptr when absent or null.
  const json* find(const std::string& key) const {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null())
      return nullptr;
    return &*it;
  }

  bool has(const std::string& key) const { return find(key) != nullptr; }

  void require(const std::string& key) {
    if (ok() && obj_.find(key) == obj_.end())
      err_ = make_error(errc::invalid_config, prefix_ + "missing required key '" + key + "'");
  }

  void read(const std::string& key, int64_t& out) {
    if (const auto* v = value_of(key)) {
      if (too_big(*v))
        fail(errc::invalid_config, key, "integer " + v->dump() + " is out of range");
      else if (v->is_number_integer())
        out = v->get<int64_t>();
      else
        wrong_type(key, "an integer", *v);
    }
  }

  void read(const std::string& key, std::optional<int64_t>& out) {
    if (!ok() || !has(key))
      return;
    int64_t v = 0;
    read(key, v);
    if (ok())
      out = v;
  }

  void read(const std::string& key, double& out) {
    if (const auto* v = value_of(key)) {
      if (v->is_number())
        out = v->get<double>();
      else
        wrong_type(key, "a number", *v);
    }
  }

  void read(const std::string& key, bool& out) {
    if (const auto* v = value_of(key)) {
      if (v->is_boolean())
        out = v->get<bool>();
      else
        wrong_type(key, "a boolean", *v);
    }
  }

  void read(const std::string& key, std::string& out) {
    if (const auto* v = value_of(key)) {
      if (v->is_string())
        out = v->get<std::string>();
      else
        wrong_type(key, "a string", *v);
    }
  }

  /// An integer or a list of integers (HF eos_token_id).
  void read(const std::string& key, std::vector<int64_t>& out) {
    const auto* v = value_of(key);
    if (v == nullptr)
      return;
    if (v->is_number_integer() && !too_big(*v)) {
      out = {v->get<int64_t>()};
      return;
    }
    if (!v->is_array()) {
      wrong_type(key, "an integer or a list of integers", *v);
      return;
    }
    std::vector<int64_t> ids;
    for (size_t i = 0; i < v->size(); ++i) {
      if (!(*v)[i].is_number_integer() || too_big((*v)[i])) {
        wrong_type(key + "[" + std::to_string(i) + "]", "an integer", (*v)[i]);
        return;
      }
      ids.push_back((*v)[i].get<int64_t>());
    }
    out = std::move(ids);
  }

  void fail(errc code, const std::string& key, const std::string& what) {
    if (ok())
      err_ = make_error(code, prefix_ + "key '" + key + "': " + what);
  }

private:
  static bool too_big(const json& v) {
    return v.is_number_unsigned() &&
           v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  }

  const json* value_of(const std::string& key) {
    if (!ok())
      return nullptr;
    auto it = obj_.find(key);
    if (it == obj_.end())
      return nullptr;
    return &*it; // null values reach the type checks of required reads
  }

  void wrong_type(const std::string& key, const char* expected_what, const json& got) {
    fail(errc::invalid_config, key,
         std::string{"expected "} + expected_what + ", got " + json_type_name(got));
  }

  const json& obj_;
  std::string prefix_;
  caf::error err_;
};

// Reads optional keys: absent or null keeps the default.
template <class T>
void read_optional(key_reader& r, const std::string& key, T& out) {
  if (r.ok() && r.has(key))
    r.read(key, out);
}

expected<std::optional<rope_scaling_config>> read_rope_scaling(const json& v,
                                                               const std::string& prefix) {
  if (v.is_null())
    return std::optional<rope_scaling_config>{};
  if (!v.is_object())
    return make_error(errc::invalid_config,
                      prefix + "key 'rope_scaling': expected an object, got " + json_type_name(v));
  key_reader r{v, prefix + "rope_scaling: "};
  std::string type;
  if (r.has("rope_type"))
    r.read("rope_type", type);
  else if (r.has("type"))
    r.read("type", type);
  else
    r.require("rope_type");
  if (!r.ok())
    return r.error();
  if (type == "default")
    return std::optional<rope_scaling_config>{};
  if (type != "linear" && type != "llama3")
    return make_error(errc::unsupported, prefix + "key 'rope_scaling': rope_type '" + type +
                                             "' is not supported (supported: linear, llama3)");
  rope_scaling_config rs;
  rs.rope_type = type;
  r.require("factor");
  r.read("factor", rs.factor);
  if (type == "llama3") {
    r.require("low_freq_factor");
    r.read("low_freq_factor", rs.low_freq_factor);
    r.require("high_freq_factor");
    r.read("high_freq_factor", rs.high_freq_factor);
    r.require("original_max_position_embeddings");
    r.read("original_max_position_embeddings", rs.original_max_position_embeddings);
  }
  if (!r.ok())
    return r.error();
  return std::optional<rope_scaling_config>{rs};
}

// The architecture: architectures[0], else model_type; both must agree.
// Answers its table entry and its name.
expected<std::pair<const arch_info*, std::string>> read_architecture(key_reader& r,
                                                                     const std::string& prefix) {
  const arch_info* arch = nullptr;
  std::string arch_name;
  if (const auto* list = r.find("architectures")) {
    if (!list->is_array() || list->empty() || !(*list)[0].is_string())
      return make_error(errc::invalid_config,
                        prefix + "key 'architectures': expected a non-empty list of strings, got " +
                            list->dump());
    arch_name = (*list)[0].get<std::string>();
    arch = find_arch(arch_name);
    if (arch == nullptr)
      return make_error(errc::unsupported,
                        prefix + "key 'architectures': architecture '" + arch_name +
                            "' is not supported (supported: " + supported_architectures() + ")");
  }
  if (const auto* mt = r.find("model_type")) {
    if (!mt->is_string())
      return make_error(errc::invalid_config,
                        prefix + "key 'model_type': expected a string, got " + json_type_name(*mt));
    auto name = mt->get<std::string>();
    const auto* by_type = find_model_type(name);
    if (arch == nullptr && by_type == nullptr)
      return make_error(errc::unsupported,
                        prefix + "key 'model_type': model type '" + name +
                            "' is not supported (supported: llama, qwen2, mistral)");
    if (arch != nullptr && by_type != arch)
      return make_error(errc::invalid_config, prefix + "key 'model_type': '" + name +
                                                  "' does not match architecture '" + arch_name +
                                                  "' (expected '" + arch->model_type + "')");
    if (arch == nullptr)
      arch_name = std::string{by_type->family} + "ForCausalLM";
    arch = by_type;
  }
  if (arch == nullptr)
    return make_error(errc::invalid_config,
                      prefix + "missing required key 'architectures' (or 'model_type')");
  return std::pair{arch, arch_name};
}

// The keys of one family: Llama's biases, and the sliding-window attention
// that Qwen2 and Mistral configs may ask for (unsupported). Failures go to r.
void read_family_keys(key_reader& r, const json& j, llama_config& c) {
  if (is_family(c, "llama")) {
    bool attention_bias = false;
    read_optional(r, "attention_bias", attention_bias);
    c.qkv_bias = c.o_bias = attention_bias;
    read_optional(r, "mlp_bias", c.mlp_bias);
  } else if (is_family(c, "qwen2")) {
    c.qkv_bias = true;
    bool sliding = false;
    read_optional(r, "use_sliding_window", sliding);
    if (r.ok() && sliding)
      r.fail(errc::unsupported, "use_sliding_window", "sliding-window attention is not supported");
  } else if (is_family(c, "mistral")) {
    std::optional<int64_t> window = int64_t{4096}; // MistralConfig's default
    if (j.contains("sliding_window")) {
      window.reset();
      read_optional(r, "sliding_window", window);
    }
    if (r.ok() && window && *window < c.max_position_embeddings)
      r.fail(errc::unsupported, "sliding_window",
             "sliding-window attention (window " + std::to_string(*window) +
                 " < max_position_embeddings " + std::to_string(c.max_position_embeddings) +
                 ") is not supported");
  }
}

// A score head's id2label (a config for a reward or value model) must name
// one output. Failures go to r.
void check_score_labels(key_reader& r, const llama_config& c) {
  const auto* labels = r.find("id2label");
  if (!r.ok() || labels == nullptr || is_causal_lm(c.architecture))
    return;
  if (!labels->is_object())
    r.fail(errc::invalid_config, "id2label",
           std::string{"expected an object, got "} + json_type_name(*labels));
  else if (labels->size() != 1)
    r.fail(errc::unsupported, "id2label",
           std::to_string(labels->size()) +
               " labels; only one-output score heads (reward / value) are supported");
}

} // namespace

int64_t llama_config::resolved_head_dim() const {
  if (head_dim != 0)
    return head_dim;
  return num_attention_heads > 0 ? hidden_size / num_attention_heads : 0;
}

expected<llama_config> parse_hf_config(const std::string& json_text,
                                       const std::string& source_name) {
  auto prefix = source_name + ": ";
  if (auto at = runtime::json_too_deep_at(json_text); at != std::string_view::npos)
    return runtime::json_too_deep(source_name, at);
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    return make_error(errc::parse_error, prefix + "not valid JSON: " + e.what());
  }
  if (!j.is_object())
    return make_error(errc::parse_error,
                      prefix + "expected a JSON object, got " + json_type_name(j));
  key_reader r{j, prefix};

  auto architecture = read_architecture(r, prefix);
  if (!architecture)
    return architecture.error();
  const auto& [arch, arch_name] = *architecture;

  llama_config c;
  c.architecture = arch_name;
  c.max_position_embeddings = arch->default_max_position_embeddings;
  c.rms_norm_eps = arch->default_rms_norm_eps;
  c.rope_theta = 10000.0;
  c.torch_dtype = "float32";
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads"}) {
    r.require(key);
  }
  r.read("vocab_size", c.vocab_size);
  r.read("hidden_size", c.hidden_size);
  r.read("intermediate_size", c.intermediate_size);
  r.read("num_hidden_layers", c.num_hidden_layers);
  r.read("num_attention_heads", c.num_attention_heads);
  c.num_key_value_heads = c.num_attention_heads;
  read_optional(r, "num_key_value_heads", c.num_key_value_heads);
  read_optional(r, "head_dim", c.head_dim);
  read_optional(r, "max_position_embeddings", c.max_position_embeddings);
  read_optional(r, "rope_theta", c.rope_theta);
  read_optional(r, "rms_norm_eps", c.rms_norm_eps);
  read_optional(r, "tie_word_embeddings", c.tie_word_embeddings);
  // transformers >= 4.56 writes "dtype"; older versions "torch_dtype".
  read_optional(r, r.has("torch_dtype") ? "torch_dtype" : "dtype", c.torch_dtype);
  read_optional(r, "bos_token_id", c.bos_token_id);
  read_optional(r, "eos_token_id", c.eos_token_ids);
  read_optional(r, "pad_token_id", c.pad_token_id);
  if (!r.ok())
    return r.error();
  if (!known_dtype(c.torch_dtype))
    return make_error(errc::unsupported,
                      prefix + "key '" + (r.has("torch_dtype") ? "torch_dtype" : "dtype") + "': '" +
                          c.torch_dtype +
                          "' is not supported (supported: float32, float16, bfloat16)");

  std::string act = "silu";
  read_optional(r, "hidden_act", act);
  if (!r.ok())
    return r.error();
  if (act != "silu")
    return make_error(errc::unsupported, prefix + "key 'hidden_act': '" + act +
                                             "' is not supported (supported: silu)");

  if (const auto* rs = r.find("rope_scaling")) {
    auto scaling = read_rope_scaling(*rs, prefix);
    if (!scaling)
      return scaling.error();
    c.rope_scaling = *scaling;
  }

  read_family_keys(r, j, c);
  check_score_labels(r, c);
  if (!r.ok())
    return r.error();
  if (auto ok = validate(c); !ok)
    return with_prefix(ok.error(), source_name);
  return c;
}

expected<llama_config> load_hf_config(const std::string& path) {
  auto text = runtime::read_file(path, uint64_t{16} << 20);
  if (!text)
    return text.error();
  return parse_hf_config(*text, path);
}

expected<void> validate(const llama_config& c) {
  std::vector<std::pair<errc, std::string>> v;
  auto bad = [&](std::string msg, errc code = errc::invalid_config) {
    v.emplace_back(code, std::move(msg));
  };
  const auto* arch = find_arch(c.architecture);
  if (arch == nullptr)
    bad("architecture '" + c.architecture +
            "' is not supported (supported: " + supported_architectures() + ")",
        errc::unsupported);
  auto positive = [&](const char* key, int64_t x) {
    if (x <= 0)
      bad(std::string{"'"} + key + "' must be positive, got " + std::to_string(x));
  };
  positive("vocab_size", c.vocab_size);
  positive("hidden_size", c.hidden_size);
  positive("intermediate_size", c.intermediate_size);
  positive("num_hidden_layers", c.num_hidden_layers);
  positive("num_attention_heads", c.num_attention_heads);
  positive("num_key_value_heads", c.num_key_value_heads);
  positive("max_position_embeddings", c.max_position_embeddings);
  // Bounds far above any model's, so that a hostile config.json cannot ask
  // for terabytes or overflow the sizes derived from it.
  auto at_most = [&](const char* key, int64_t x, int64_t limit) {
    if (x > limit)
      bad(std::string{"'"} + key + "' is " + std::to_string(x) + ", above the limit of " +
              std::to_string(limit),
          errc::out_of_range);
  };
  at_most("vocab_size", c.vocab_size, int64_t{1} << 24);
  at_most("hidden_size", c.hidden_size, int64_t{1} << 18);
  at_most("intermediate_size", c.intermediate_size, int64_t{1} << 20);
  at_most("num_hidden_layers", c.num_hidden_layers, int64_t{1} << 12);
  at_most("num_attention_heads", c.num_attention_heads, int64_t{1} << 12);
  at_most("num_key_value_heads", c.num_key_value_heads, int64_t{1} << 12);
  at_most("head_dim", c.head_dim, int64_t{1} << 14);
  at_most("max_position_embeddings", c.max_position_embeddings, int64_t{1} << 26);
  if (c.head_dim < 0)
    bad("'head_dim' must be positive (or 0 for hidden_size / num_attention_heads), got " +
        std::to_string(c.head_dim));
  if (c.num_attention_heads > 0 && c.num_key_value_heads > 0 &&
      c.num_attention_heads % c.num_key_value_heads != 0)
    bad("'num_attention_heads' (" + std::to_string(c.num_attention_heads) +
        ") must be divisible by 'num_key_value_heads' (" + std::to_string(c.num_key_value_heads) +
        ")");
  if (c.head_dim == 0 && c.hidden_size > 0 && c.num_attention_heads > 0 &&
      c.hidden_size % c.num_attention_heads != 0)
    bad("'hidden_size' (" + std::to_string(c.hidden_size) +
        ") must be divisible by 'num_attention_heads' (" + std::to_string(c.num_attention_heads) +
        ") unless 'head_dim' is set");
  else if (c.head_dim >= 0 && c.resolved_head_dim() % 2 != 0)
    bad("'head_dim' (" + std::to_string(c.resolved_head_dim()) +
        ") must be even for rotary position embeddings");
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta))
    bad("'rope_theta' must be a positive number, got " + std::to_string(c.rope_theta));
  if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps))
    bad("'rms_norm_eps' must be a positive number, got " + std::to_string(c.rms_norm_eps));
  if (!known_dtype(c.torch_dtype))
    bad("'torch_dtype' '" + c.torch_dtype +
            "' is not supported (supported: float32, float16, bfloat16)",
        errc::unsupported);
  auto token = [&](const std::string& key, int64_t id) {
    if (id < 0 || (c.vocab_size > 0 && id >= c.vocab_size))
      bad("'" + key + "' (" + std::to_string(id) + ") must lie in [0, vocab_size " +
          std::to_string(c.vocab_size) + ")");
  };
  if (c.bos_token_id)
    token("bos_token_id", *c.bos_token_id);
  for (size_t i = 0; i < c.eos_token_ids.size(); ++i)
    token(c.eos_token_ids.size() == 1 ? "eos_token_id" : "eos_token_id[" + std::to_string(i) + "]",
          c.eos_token_ids[i]);
  if (c.pad_token_id)
    token("pad_token_id", *c.pad_token_id);
  if (is_family(c, "llama") && c.qkv_bias != c.o_bias)
    bad("Llama has one 'attention_bias' for q/k/v and o: qkv_bias and o_bias must agree",
        errc::unsupported);
  if (is_family(c, "qwen2") && (!c.qkv_bias || c.o_bias || c.mlp_bias))
    bad("Qwen2 has q/k/v biases and no o/mlp biases: need qkv_bias=true, o_bias=false, "
        "mlp_bias=false",
        errc::unsupported);
  if (is_family(c, "mistral") && (c.qkv_bias || c.o_bias || c.mlp_bias))
    bad("Mistral has no biases: need qkv_bias, o_bias and mlp_bias false", errc::unsupported);
  if (c.rope_scaling) {
    const auto& rs = *c.rope_scaling;
    if (rs.rope_type != "linear" && rs.rope_type != "llama3")
      bad("'rope_scaling.rope_type' '" + rs.rope_type +
              "' is not supported (supported: linear, llama3)",
          errc::unsupported);
    if (!(rs.factor > 0) || !std::isfinite(rs.factor))
      bad("'rope_scaling.factor' must be a positive number, got " + std::to_string(rs.factor));
    if (rs.rope_type == "llama3") {
      if (!(rs.low_freq_factor > 0) || !(rs.high_freq_factor > rs.low_freq_factor) ||
          !std::isfinite(rs.high_freq_factor))
        bad("'rope_scaling': need 0 < low_freq_factor < high_freq_factor, got " +
            std::to_string(rs.low_freq_factor) + " and " + std::to_string(rs.high_freq_factor));
      if (rs.original_max_position_embeddings <= 0)
        bad("'rope_scaling.original_max_position_embeddings' must be positive, got " +
            std::to_string(rs.original_max_position_embeddings));
    }
  }
  if (v.empty())
    return caf::unit;
  std::string msg;
  for (const auto& [code, text] : v) {
    if (!msg.empty())
      msg += "; ";
    msg += text;
  }
  return make_error(v.front().first, std::move(msg));
}

std::string to_hf_config_json(const llama_config& c) {
  using ojson = nlohmann::ordered_json;
  const auto* arch = find_arch(c.architecture);
  ojson j = ojson::object();
  j["architectures"] = ojson::array({c.architecture});
  j["model_type"] = arch ? arch->model_type : "llama";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  if (c.head_dim != 0)
    j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling) {
    const auto& rs = *c.rope_scaling;
    ojson s = ojson::object();
    s["rope_type"] = rs.rope_type;
    s["factor"] = rs.factor;
    if (rs.rope_type == "llama3") {
      s["low_freq_factor"] = rs.low_freq_factor;
      s["high_freq_factor"] = rs.high_freq_factor;
      s["original_max_position_embeddings"] = rs.original_max_position_embeddings;
    }
    j["rope_scaling"] = std::move(s);
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (is_family(c, "llama")) {
    j["attention_bias"] = c.qkv_bias;
    j["mlp_bias"] = c.mlp_bias;
    j["pretraining_tp"] = 1;
  } else if (is_family(c, "qwen2")) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_hidden_layers;
  } else if (is_family(c, "mistral")) {
    j["sliding_window"] = nullptr;
  }
  if (!is_causal_lm(c.architecture)) {
    // One output: HF's default of two labels would give score a second row.
    j["id2label"] = {{"0", "LABEL_0"}};
    j["label2id"] = {{"LABEL_0", 0}};
  }
  j["attention_dropout"] = 0.0;
  j["torch_dtype"] = c.torch_dtype;
  j["bos_token_id"] = c.bos_token_id ? ojson(*c.bos_token_id) : ojson(nullptr);
  if (c.eos_token_ids.empty())
    j["eos_token_id"] = nullptr;
  else if (c.eos_token_ids.size() == 1)
    j["eos_token_id"] = c.eos_token_ids.front();
  else
    j["eos_token_id"] = c.eos_token_ids;
  j["pad_token_id"] = c.pad_token_id ? ojson(*c.pad_token_id) : ojson(nullptr);
  j["use_cache"] = true;
  return j.dump(2) + "\n";
}

std::vector<double> rope_inv_freq(const llama_config& c) {
  const int64_t d = c.resolved_head_dim();
  std::vector<double> out;
  if (d <= 0)
    return out;
  out.reserve(static_cast<size_t>(d / 2));
  for (int64_t i = 0; i < d / 2; ++i)
    out.push_back(1.0 /
                  std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(d)));
  if (!c.rope_scaling)
    return out;
  const auto& rs = *c.rope_scaling;
  if (rs.rope_type == "linear") {
    for (auto& f : out)
      f /= rs.factor;
    return out;
  }
  if (rs.rope_type == "llama3") {
    // NOTE [llama3 rope scaling]: long wavelengths are slowed by `factor`,
    // short ones kept, and the band between interpolated smoothly.
    const double old_len = static_cast<double>(rs.original_max_position_embeddings);
    const double low_freq_wavelen = old_len / rs.low_freq_factor;
    const double high_freq_wavelen = old_len / rs.high_freq_factor;
    const double pi = 3.14159265358979323846;
    for (auto& f : out) {
      const double wavelen = 2 * pi / f;
      if (wavelen < high_freq_wavelen)
        continue;
      if (wavelen > low_freq_wavelen) {
        f /= rs.factor;
        continue;
      }
      const double smooth =
          (old_len / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
      f = (1 - smooth) * f / rs.factor + smooth * f;
    }
  }
  return out;
}

int64_t decode_panels_bytes(const llama_config& c, kernels::cpu::decode_isa isa) {
  const int64_t rows = kernels::cpu::panel_rows(isa);
  auto packed_size = [rows](int64_t r, int64_t k) { return kernels::cpu::packed_size(r, k, rows); };
  const int64_t D = c.hidden_size, hd = c.resolved_head_dim();
  const int64_t q = c.num_attention_heads * hd, kv = c.num_key_value_heads * hd;
  const int64_t layer = packed_size(q + 2 * kv, D) + packed_size(D, q) +
                        packed_size(2 * c.intermediate_size, D) +
                        packed_size(D, c.intermediate_size);
  return 4 * (c.num_hidden_layers * layer + packed_size(c.vocab_size, D));
}

} // namespace troupe::models
