// The bitwise comparison every consumer shares (mok/core/fields.h): what counts as a difference, and
// how a mismatch reads.
#include "mok/core/fields.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <vector>

namespace mok::test {
namespace {

TEST(RawBits, TellSignedZerosAndNanPayloadsApart) {
  EXPECT_NE(raw_bits(0.0f), raw_bits(-0.0f));
  EXPECT_NE(raw_bits(bf16{0x7fc0}), raw_bits(bf16{0x7fc1}));
  EXPECT_EQ(raw_bits(bf16{0x8000}), 0x8000u);
  EXPECT_EQ(raw_bits(int32_t(-1)), 0xffffffffu);
}

TEST(ShowElement, GivesTheBitsAndTheExactValue) {
  EXPECT_EQ(show_element(to_bf16(1.0f)), "0x3f80 (0x1p+0)");
  EXPECT_EQ(show_element(-0.0f), "0x80000000 (-0x0p+0)");
  EXPECT_EQ(show_element(0x1p-149f), "0x00000001 (0x1p-149)");
  EXPECT_EQ(show_element(int32_t(-5)), "-5");
}

TEST(FirstBitMismatch, NamesTheFirstDifferingElement) {
  const std::vector<float> a = {1.0f, 0.0f, 2.0f}, b = {1.0f, -0.0f, 3.0f};
  EXPECT_EQ(first_bit_mismatch("v", a, b), "v[1]: 0x00000000 vs 0x80000000");
  EXPECT_EQ(first_bit_mismatch("v", a, a), "");
  EXPECT_EQ(first_bit_mismatch("v", a, std::vector<float>(2)), "v: 3 elements vs 2");
  const std::vector<bf16> c = {bf16{0x3f80}}, d = {bf16{0x3f81}};
  EXPECT_EQ(first_bit_mismatch("w", c, d), "w[0]: 0x3f80 vs 0x3f81");
}

TEST(FirstFieldMismatch, NamesTheFirstDifferingFieldInTheListsOrder) {
  Forward a;
  a.y = {bf16{0x3f80}, bf16{0x4000}};
  a.h = {bf16{0x3f80}};
  Forward b = a;
  EXPECT_EQ(first_field_mismatch(a, b), "");
  b.h[0] = bf16{0xbf80};
  b.y[1] = bf16{0x4001};
  EXPECT_EQ(first_field_mismatch(a, b), "y[1]: 0x4000 vs 0x4001");  // y comes before h
  Gradients g, d;
  g.d_w2 = {1.0f};
  d.d_w2 = {1.0f, 2.0f};
  EXPECT_EQ(first_field_mismatch(g, d), "d_w2: 1 elements vs 2");
}

TEST(FirstStepMismatch, TheForwardComesBeforeTheGradients) {
  Forward f;
  f.y = {bf16{0x3f80}};
  Gradients g;
  g.dx = {bf16{0x3f80}};
  Forward f2 = f;
  Gradients g2 = g;
  EXPECT_EQ(first_step_mismatch(f, g, f2, g2), "");
  g2.dx[0] = bf16{0x3f81};
  EXPECT_EQ(first_step_mismatch(f, g, f2, g2), "dx[0]: 0x3f80 vs 0x3f81");
  f2.y[0] = bf16{0x4000};
  EXPECT_EQ(first_step_mismatch(f, g, f2, g2), "y[0]: 0x3f80 vs 0x4000");
}

TEST(FirstPoisonedField, NamesAnElementNoLaunchWrote) {
  Gradients g;
  g.dx = {bf16{0x3f80}};
  g.d_w1 = {1.0f, 2.0f};
  EXPECT_EQ(first_poisoned_field(g), "");
  g.d_w1[1] = std::bit_cast<float>(0xffffffffu);
  EXPECT_EQ(first_poisoned_field(g), "d_w1[1]");
  Forward f;
  f.layout.row_source = {0, -1};
  EXPECT_EQ(first_poisoned_field(f), "row_source[1]");
}

}  // namespace
}  // namespace mok::test
