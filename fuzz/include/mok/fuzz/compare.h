// Bit-for-bit comparison of layer results, reporting the first mismatch with its coordinates and
// both values in hex (a similarity score would hide errors in a few elements).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "mok/reference/layer.h"

namespace mok::fuzz {

// A property's outcome: nullopt when it holds, otherwise what failed.
using Verdict = std::optional<std::string>;

// Row rows_a[i] of a against row rows_b[i] of b, `width` elements each, bit for bit (mok::raw_bits).
// Rows are tokens (or layout rows): a mismatch reads "name[row a / row b, column]: value a vs value b",
// values as mok::show_element writes them.
// Two empty tensors are equal (an output the configuration does not have).
template <class T>
Verdict compare_rows(const std::string& name, const std::vector<T>& a, const std::vector<T>& b, int width,
                     const std::vector<int>& rows_a, const std::vector<int>& rows_b);

// Whole tensors viewed as rows of `width`: sizes first, then every bit.
template <class T>
Verdict compare_bits(const std::string& name, const std::vector<T>& a, const std::vector<T>& b, int width);

// Every field of two forward passes (h, shared_h and shared_a only when `activations`) and of two backward passes,
// in the order of mok::for_each_field, each viewed as rows of its width in this config. Also a difference: a run
// without its y or dx (N x H), or an element of the GPU tools' poison (mok::first_poisoned).
Verdict compare_forward(const LayerConfig& c, const ref::Forward& a, const ref::Forward& b, bool activations);
Verdict compare_gradients(const LayerConfig& c, const ref::Gradients& a, const ref::Gradients& b);

}  // namespace mok::fuzz
