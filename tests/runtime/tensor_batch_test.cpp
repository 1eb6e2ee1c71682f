#include "runtime/tensor_batch.hpp"

#include "runtime/torch_guard.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

using namespace troupe;
using troupe::runtime::tensor_batch;

namespace {

tensor_batch make_rows(int64_t rows) {
  tensor_batch b;
  EXPECT_TRUE(b.set("ids", torch::arange(rows * 3, torch::kLong).view({rows, 3})));
  EXPECT_TRUE(b.set("score", torch::arange(rows, torch::kFloat)));
  return b;
}

} // namespace

TEST(TensorBatch, RowsMustAgree) {
  auto b = make_rows(4);
  EXPECT_EQ(b.size(), 4);
  auto bad = b.set("x", torch::zeros({5}));
  ASSERT_FALSE(bad);
  EXPECT_EQ(code_of(bad.error()), errc::shape_mismatch);
  EXPECT_NE(describe(bad.error()).find("x has 5 rows, the batch has 4"), std::string::npos);
  EXPECT_FALSE(b.set("scalar", torch::tensor(1.0)));
  auto missing = b.get("nope");
  ASSERT_FALSE(missing);
  EXPECT_NE(describe(missing.error()).find("present: ids, score"), std::string::npos);
  // Replacing the only tensor may change the size.
  tensor_batch one;
  ASSERT_TRUE(one.set("a", torch::zeros({2})));
  EXPECT_TRUE(one.set("a", torch::zeros({3})));
  EXPECT_EQ(one.size(), 3);
}

TEST(TensorBatch, SplitSelectConcatRoundTrip) {
  auto b = make_rows(7);
  auto parts = b.split(3);
  ASSERT_TRUE(parts);
  ASSERT_EQ(parts->size(), 3u);
  EXPECT_EQ((*parts)[0].size(), 3);
  EXPECT_EQ((*parts)[1].size(), 2);
  EXPECT_EQ((*parts)[2].size(), 2);
  auto whole = tensor_batch::concat(*parts);
  ASSERT_TRUE(whole);
  for (const auto& [name, t] : b.tensors())
    EXPECT_TRUE(torch::equal(t, *whole->get(name))) << name;
  auto picked = b.select(torch::tensor({6, 0, 3}, torch::kLong));
  ASSERT_TRUE(picked);
  EXPECT_TRUE(torch::equal(*picked->get("score"), torch::tensor({6.0f, 0.0f, 3.0f})));
  EXPECT_FALSE(b.split(0));
  EXPECT_FALSE(b.split(8));
  EXPECT_FALSE(b.slice(2, 9));
  auto other = make_rows(2);
  other.erase("score");
  EXPECT_FALSE(tensor_batch::concat({b, other}));
}

TEST(TorchGuard, ErrorsThrownInsideKeepTheirCode) {
  auto r = guarded("outer", []() -> expected<int> {
    value_or_throw(expected<void>{make_error(errc::not_found, "inner")});
    return 1;
  });
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::not_found);
  EXPECT_EQ(describe(r.error()), "not_found: outer: inner");
  EXPECT_EQ(*guarded("ok", [] { return value_or_throw(expected<int>{5}); }), 5);
}

TEST(TensorBatchWire, RoundTripsEveryDtypeAndRefusesBadForms) {
  tensor_batch b;
  ASSERT_TRUE(b.set("ids", torch::arange(12, torch::kLong).view({4, 3})));
  ASSERT_TRUE(b.set("mask", torch::tensor({true, false, true, true})));
  ASSERT_TRUE(b.set("logp", torch::randn({4, 3}).to(torch::kBFloat16)));
  ASSERT_TRUE(b.set("values", torch::randn({6, 4}).t())); // non-contiguous [4, 6]
  ASSERT_TRUE(b.set("none", torch::empty({4, 0})));
  auto w = runtime::to_wire(b);
  ASSERT_TRUE(w) << describe(w.error());
  auto back = runtime::from_wire(*w);
  ASSERT_TRUE(back) << describe(back.error());
  EXPECT_EQ(back->size(), 4);
  for (const auto& [name, t] : b.tensors()) {
    auto got = back->get(name);
    ASSERT_TRUE(got) << name;
    EXPECT_EQ(got->scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(*got, t)) << name;
  }

  auto short_data = *w;
  short_data.data[0].pop_back();
  auto bad = runtime::from_wire(short_data);
  ASSERT_FALSE(bad);
  EXPECT_NE(describe(bad.error()).find("bytes for a"), std::string::npos) << describe(bad.error());
  auto bad_dtype = *w;
  bad_dtype.dtypes[1] = "F128";
  EXPECT_FALSE(runtime::from_wire(bad_dtype));
  auto ragged = *w;
  ragged.shapes.pop_back();
  EXPECT_FALSE(runtime::from_wire(ragged));
  auto rows = *w;
  rows.shapes[0] = {2, 6}; // same bytes, a different batch size
  auto mismatch = runtime::from_wire(rows);
  EXPECT_FALSE(mismatch) << "rows that disagree must be refused";
}
