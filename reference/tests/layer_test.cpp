#include "mok/reference/layer.h"

#include <gtest/gtest.h>

#include "mok/reference/problem.h"

namespace mok::ref {
namespace {

TEST(Layer, SmokeForwardBackward) {
  LayerConfig c;
  c.ranks = 2;
  c.tokens_per_rank = 16;
  c.experts = 4;
  c.hidden = 64;
  c.intermediate = 64;
  c.top_k = 2;
  Problem p = make_problem(c, 1);
  Forward f = forward(c, p.x, p.weights, nullptr, Options{});
  Gradients g = backward(c, p.x, p.weights, f, p.dy, Options{});
  EXPECT_EQ(f.y.size(), size_t(32 * 64));
  EXPECT_EQ(g.dx.size(), size_t(32 * 64));
}

}  // namespace
}  // namespace mok::ref
