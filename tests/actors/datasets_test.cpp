// Dataset files (NOTE [dataset files]): field mappings, conversations, JSON
// arrays, malformed rows, the length filter and the held-out split.

#include "actors/rl/data.hpp"
#include "actors/rl/datasets.hpp"
#include "models/tokenizer.hpp"
#include "tests/models/tokenizer_reference.hpp"
#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

using namespace troupe;
using namespace troupe::actors::rl;

namespace {

template <class T>
T must(expected<T> x) {
  EXPECT_TRUE(x) << describe(x.error());
  if (!x)
    throw std::runtime_error(describe(x.error()));
  return std::move(*x);
}

std::string error_text(const caf::error& e) {
  return context_of(e);
}

TEST(Datasets, CustomAndNestedFieldNames) {
  test::temp_dir dir;
  auto path = dir.write("gsm.jsonl",
                        R"({"question": "2+2?", "reward_model": {"ground_truth": 4}, "extra": 1})"
                        "\n"
                        R"({"question": "1/2?", "reward_model": {"ground_truth": 0.5}})"
                        "\n");
  dataset_fields f;
  f.prompt = "question";
  f.answer = "reward_model.ground_truth";
  auto rows = must(load_examples(path, f));
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].prompt, "2+2?");
  EXPECT_EQ(rows[0].answer, "4") << "a number answer reads as its text";
  EXPECT_EQ(rows[1].answer, "0.5");
  EXPECT_TRUE(rows[0].messages.empty());
  // A literal key with a dot wins over the nested path.
  auto lit = dir.write("lit.jsonl", R"({"question": "q", "reward_model.ground_truth": "x",)"
                                    R"( "reward_model": {"ground_truth": "y"}})");
  EXPECT_EQ(must(load_examples(lit, f))[0].answer, "x");
}

TEST(Datasets, ConversationsUnderEitherKeyAndMetadata) {
  test::temp_dir dir;
  auto path = dir.write(
      "chat.jsonl",
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}], "answer": "5", "metadata": {"id": 7, "tags": ["é"]}})"
      "\n"
      R"({"prompt": [{"role": "user", "content": "4+4?"}, {"role": "assistant", "content": "8"}]})"
      "\n");
  auto rows = must(load_examples(path));
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].prompt, "2+3?") << "the last user message, for display";
  EXPECT_EQ(rows[0].answer, "5");
  EXPECT_EQ(nlohmann::json::parse(rows[0].messages).size(), 2u);
  EXPECT_EQ(rows[0].metadata, R"({"id":7,"tags":["é"]})") << "JSON, non-ASCII kept";
  // A final assistant message is the answer, and leaves the prompt.
  EXPECT_EQ(rows[1].answer, "8");
  EXPECT_EQ(rows[1].messages, R"([{"role":"user","content":"4+4?"}])");
  EXPECT_TRUE(rows[1].metadata.empty());

  auto demo_path = dir.write(
      "sft.jsonl",
      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})");
  auto demos = must(load_demonstrations(demo_path));
  EXPECT_EQ(demos[0].response, "hello");
  EXPECT_EQ(demos[0].messages, R"([{"role":"user","content":"hi"}])");
  auto pref_path = dir.write(
      "rm.jsonl",
      R"({"messages": [{"role": "user", "content": "hi"}], "chosen": "hello", "rejected": "go"})");
  auto prefs = must(load_preferences(pref_path));
  EXPECT_EQ(prefs[0].chosen, "hello");
  EXPECT_EQ(prefs[0].messages, R"([{"role":"user","content":"hi"}])");
}

TEST(Datasets, AJsonArrayFileNamesRowsByPlace) {
  test::temp_dir dir;
  auto good =
      dir.write("d.json", R"([{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}])");
  auto rows = must(load_examples(good));
  EXPECT_EQ(rows, (std::vector<example>{{"a", "1"}, {"b", "2"}}));
  auto bad = dir.write("bad.json", R"([{"prompt": "a", "answer": "1"}, {"prompt": "b"}])");
  auto e = load_examples(bad);
  ASSERT_FALSE(e);
  EXPECT_EQ(error_text(e.error()), bad + ": row 2: field \"answer\": missing, expected a string");
  auto not_array = dir.write("obj.json", R"({"prompt": "a", "answer": "1"})");
  EXPECT_EQ(error_text(load_examples(not_array).error()),
            not_array + ": expected a JSON array of row objects, got object");
}

TEST(Datasets, MalformedConversationsNameTheFieldAndLine) {
  struct row {
    std::string line;
    std::string reason;
  };
  const std::vector<row> table{
      {R"({"messages": "hi", "answer": "a"})",
       "field \"messages\": expected a non-empty list of messages, got string"},
      {R"({"messages": [], "answer": "a"})",
       "field \"messages\": expected a non-empty list of messages, got an empty list"},
      {R"({"messages": [{"content": "hi"}], "answer": "a"})",
       "field \"messages[0].role\": expected a non-empty string"},
      {R"({"messages": [{"role": "user", "content": [{"type": "text"}]}], "answer": "a"})",
       "field \"messages[0].content\": expected a string or null, got array"},
      {R"({"prompt": "p", "messages": [{"role": "user", "content": "x"}], "answer": "a"})",
       "field \"prompt\": the row has both a prompt and messages (\"messages\"): expected one of "
       "them"},
      {R"({"messages": [{"role": "assistant", "content": "8"}]})",
       "field \"messages\": a conversation's final assistant message gives the answer: expected "
       "its content and a prompt before it"},
  };
  test::temp_dir dir;
  for (size_t i = 0; i < table.size(); ++i) {
    auto path = dir.write("bad" + std::to_string(i) + ".jsonl",
                          "{\"prompt\": \"q\", \"answer\": \"a\"}\n" + table[i].line + "\n");
    auto e = load_examples(path);
    ASSERT_FALSE(e) << table[i].line;
    EXPECT_EQ(error_text(e.error()), path + ":2: " + table[i].reason);
  }
}

TEST(Datasets, RowsReadBackOnDemandAndSubsetsKeepOrder) {
  test::temp_dir dir;
  std::string text;
  for (int i = 0; i < 50; ++i)
    text += "{\"prompt\": \"p" + std::to_string(i) + "\", \"answer\": \"" + std::to_string(i) +
            "\"}\r\n" + (i % 7 == 0 ? "\n" : "");
  auto path = dir.write("rows.jsonl", text);
  auto t = must(open_rows<example>(path, {}));
  ASSERT_EQ(t.size(), 50);
  EXPECT_EQ(must(t.at(37)).prompt, "p37");
  auto sub = t.subset({9, 3, 40});
  EXPECT_EQ(sub.size(), 3);
  EXPECT_EQ(must(sub.at(2)).answer, "40");
  auto subsub = sub.subset({2, 0});
  EXPECT_EQ(must(subsub.rows({0, 1})), (std::vector<example>{{"p40", "40"}, {"p9", "9"}}));
  EXPECT_FALSE(t.at(50));
  // A file rewritten under the job: the row's line is named.
  dir.write("rows.jsonl", "{}");
  auto gone = t.at(49);
  ASSERT_FALSE(gone);
  EXPECT_NE(error_text(gone.error()).find(path + ":"), std::string::npos)
      << error_text(gone.error());
}

data_limits char_limits(int64_t context, int64_t max_new) {
  data_limits l;
  l.prompt_tokens = [](const std::string& p, const std::string&) -> expected<int64_t> {
    return static_cast<int64_t>(p.size()) + 1; // BOS
  };
  l.response_tokens = [](const std::string& r) { return static_cast<int64_t>(r.size()) + 1; };
  l.context = context;
  l.max_new_tokens = max_new;
  return l;
}

TEST(Datasets, PromptsLongerThanTheContextAreDroppedAndCounted) {
  test::temp_dir dir;
  data_config c;
  c.train_file = dir.write("t.jsonl", "{\"prompt\": \"12345\", \"answer\": \"a\"}\n"
                                      "{\"prompt\": \"123456\", \"answer\": \"b\"}\n"
                                      "{\"prompt\": \"1234\", \"answer\": \"c\"}\n");
  c.sft_file = dir.write("s.jsonl", "{\"prompt\": \"12\", \"response\": \"1234567\"}\n"
                                    "{\"prompt\": \"12\", \"response\": \"12345\"}\n");
  // Context 10, 4 new tokens: prompts of at most 5 characters (+ BOS) fit;
  // demonstrations of prompt + response + BOS + EOS <= 10.
  auto d = must(load_job_data(c, char_limits(10, 4)));
  EXPECT_EQ(d.train.size(), 2);
  EXPECT_EQ(must(d.train.at(1)).answer, "c");
  EXPECT_EQ(d.sft.size(), 1);
  ASSERT_EQ(d.notes.size(), 2u);
  EXPECT_EQ(d.notes[0], "data.train_file: 1 of 3 prompts dropped as too long (prompt + "
                        "rl.generation.max_tokens 4 > the context of 10 tokens)");
  EXPECT_EQ(d.notes[1], "data.sft_file: 1 of 2 demonstrations dropped as too long (prompt + "
                        "response > the context of 10 tokens)");
  auto none = load_job_data(c, char_limits(5, 4));
  ASSERT_FALSE(none);
  EXPECT_NE(error_text(none.error())
                .find("data.train_file: " + c.train_file + ": all 3 prompts are too long"),
            std::string::npos)
      << error_text(none.error());
}

TEST(Datasets, AHeldOutSplitIsExactBySeedAndDisjoint) {
  test::temp_dir dir;
  std::string text;
  for (int i = 0; i < 200; ++i)
    text += "{\"prompt\": \"p" + std::to_string(i) + "\", \"answer\": \"a\"}\n";
  data_config c;
  c.train_file = dir.write("t.jsonl", text);
  c.eval_split = 0.1;
  auto a = must(load_job_data(c));
  auto b = must(load_job_data(c));
  ASSERT_EQ(a.eval.size(), 20u);
  EXPECT_EQ(a.train.size(), 180);
  EXPECT_EQ(a.eval, b.eval) << "the same seed holds out the same rows";
  std::set<std::string> held;
  for (const auto& e : a.eval)
    held.insert(e.prompt);
  for (const auto& e : must(a.train.all()))
    EXPECT_EQ(held.count(e.prompt), 0u) << e.prompt << " is in both";
  c.seed += 1;
  EXPECT_NE(must(load_job_data(c)).eval, a.eval) << "another seed, other rows";
  c.eval_split = 0.001;
  EXPECT_FALSE(load_job_data(c)) << "0.2 rows: nothing held out";
}

TEST(Datasets, CheckingFilesReportsRowsOrTheFirstBadRow) {
  test::temp_dir dir;
  data_config c;
  c.train_file = dir.write("t.jsonl", "{\"prompt\": \"p\", \"answer\": \"a\"}\n");
  c.preference_file =
      dir.write("p.jsonl", "{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\n"
                           "{\"prompt\": \"p\", \"chosen\": \"a\"}\n");
  auto bad = check_data_files(c);
  ASSERT_FALSE(bad);
  EXPECT_EQ(error_text(bad.error()), "data.preference_file: " + c.preference_file +
                                         ":2: field \"rejected\": missing, expected a string");
  c.preference_file.clear();
  auto ok = must(check_data_files(c));
  EXPECT_EQ(ok, (std::vector<std::string>{"data.train_file: " + c.train_file + ": 1 rows"}));
}

} // namespace

namespace {

TEST(PromptEncoder, ConversationsGoThroughTheChatTemplateAndPlainPromptsWhenAsked) {
  if (auto why = test::reference_missing(); !why.empty())
    GTEST_SKIP() << why;
  auto loaded = models::load_tokenizer(test::real_tokenizer_dir("qwen3"));
  ASSERT_TRUE(loaded) << describe(loaded.error());
  std::shared_ptr<const models::tokenizer> tok = std::move(*loaded);
  const std::string messages = R"([{"role":"user","content":"2+3?"}])";
  prompt_encoder plain{tok, false};
  auto ids = plain.prompt("2+3?", messages);
  ASSERT_TRUE(ids) << describe(ids.error());
  EXPECT_EQ(*ids, tok->encode("<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n"));
  EXPECT_EQ(must(plain.prompt("2+3?", "")), tok->encode("2+3?")) << "a plain prompt as it is";
  prompt_encoder templated{tok, true};
  EXPECT_EQ(must(templated.prompt("2+3?", "")), *ids) << "data.chat_template: one user message";
  // The byte tokenizer has no template: a conversation is refused, saying so.
  prompt_encoder bytes{std::make_shared<models::byte_tokenizer>(), false};
  auto refused = bytes.prompt("", messages);
  ASSERT_FALSE(refused);
  EXPECT_NE(context_of(refused.error()).find("a conversation needs the model's chat template"),
            std::string::npos)
      << context_of(refused.error());
}

} // namespace

namespace {

// NOTE [prefix check]: Qwen3's template drops an earlier assistant turn's
// <think> block once a later user turn follows — not append-only — while
// Llama 3's renders every turn the same way whatever follows.
TEST(PromptEncoder, ThePrefixCheckCatchesATemplateThatRewritesEarlierTurns) {
  if (auto why = test::reference_missing(); !why.empty())
    GTEST_SKIP() << why;
  auto encoder = [](const char* name) {
    auto loaded = models::load_tokenizer(test::real_tokenizer_dir(name));
    EXPECT_TRUE(loaded) << describe(loaded.error());
    return prompt_encoder{std::shared_ptr<const models::tokenizer>(std::move(*loaded)), false};
  };
  const std::string conversation =
      R"([{"role":"user","content":"2+3?"},)"
      R"({"role":"assistant","content":"<think>\nadd them\n</think>\n\n5"},)"
      R"({"role":"user","content":"and 4+4?"},{"role":"assistant","content":"8"}])";
  auto qwen3 = encoder("qwen3");
  auto d = must(qwen3.divergence_of(conversation));
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->turn, 2u) << "the second user turn rewrites the first answer";
  auto first_two = must(qwen3.render(
      R"([{"role":"user","content":"2+3?"},{"role":"assistant","content":"<think>\nadd them\n</think>\n\n5"}])",
      false));
  EXPECT_EQ(first_two.substr(d->byte, d->before.size()), d->before);
  EXPECT_EQ(d->before.rfind("<think>", 0), 0u) << d->before;
  // Llama 3's (this package's) always ends with an assistant header, which
  // the next user turn replaces.
  auto llama3 = must(encoder("llama3").divergence_of(conversation));
  ASSERT_TRUE(llama3.has_value());
  EXPECT_EQ(llama3->turn, 2u);
  EXPECT_NE(llama3->before.find("assistant"), std::string::npos) << llama3->before;
  // ChatML (the fixture) only appends.
  test::temp_dir tmp;
  const auto chatml_dir = tmp.file("chatml");
  std::filesystem::create_directories(chatml_dir);
  const auto qwen3_dir = test::real_tokenizer_dir("qwen3");
  std::filesystem::copy_file(qwen3_dir + "/tokenizer.json", chatml_dir + "/tokenizer.json");
  auto config = nlohmann::json::parse(std::ifstream(qwen3_dir + "/tokenizer_config.json"));
  std::ifstream fixture(std::string{TROUPE_SOURCE_DIR} +
                        "/tests/models/chat_templates/chatml.jinja");
  config["chat_template"] = std::string(std::istreambuf_iterator<char>(fixture), {});
  std::ofstream(chatml_dir + "/tokenizer_config.json") << config.dump();
  auto chatml = models::load_tokenizer(chatml_dir);
  ASSERT_TRUE(chatml) << describe(chatml.error());
  prompt_encoder append_only{std::shared_ptr<const models::tokenizer>(std::move(*chatml)), false};
  EXPECT_FALSE(must(append_only.divergence_of(conversation)).has_value());

  // The job's report: rows counted, the first one placed; SFT rows with
  // their response as the last turn.
  job_data data;
  example row;
  row.messages = conversation;
  example single;
  single.messages = R"([{"role":"user","content":"hi"}])";
  data.train = row_table<example>{std::vector<example>{single, row, row}};
  data_config c;
  c.train_file = "train.jsonl";
  auto report = must(check_prefixes(qwen3, c, data));
  EXPECT_EQ(report.checked, 3);
  EXPECT_EQ(report.divergent, 2);
  EXPECT_EQ(report.first.rfind(
                "data.train_file row 2: turn 2 (user) rewrites earlier text from byte ", 0),
            0u)
      << report.first;
}

} // namespace

// NOTE [preference batches]: 2B sequences become B pairs, the chosen side
// first, at one width; a sequence batch of another size is refused.
TEST(PreferenceLayout, SplitsChosenThenRejectedRowsIntoPairs) {
  auto seq =
      collate_sequences({{1, 2}, {1, 3, 4}, {1, 2}, {1, 3, 4}}, {{5}, {6, 7}, {8, 9, 9}, {7}}, 0);
  ASSERT_TRUE(seq) << describe(seq.error());
  auto b = preference_layout(*seq, 2);
  ASSERT_TRUE(b) << describe(b.error());
  auto ids = seq->get("input_ids").value();
  EXPECT_TRUE(b->get("chosen_ids").value().equal(ids.narrow(0, 0, 2)));
  EXPECT_TRUE(b->get("rejected_ids").value().equal(ids.narrow(0, 2, 2)));
  EXPECT_EQ(b->get("rejected_response_mask").value().size(1), ids.size(1) - 1);
  EXPECT_EQ(b->get("chosen_mask").value().sum().item<int64_t>(), 3 + 5);
  auto odd = preference_layout(*seq, 3);
  ASSERT_FALSE(odd);
  EXPECT_NE(describe(odd.error()).find("input_ids has 4 rows, expected 2 × 3 pairs"),
            std::string::npos)
      << describe(odd.error());
}
