// 2-D max and average pooling over (planes = B*C, H, W) arrays; one OpenMP task per plane. Padding is
// -inf for max and 0 for average; the average divides by KH*KW including padded positions (PyTorch's
// count_include_pad=True). Max-pool backward recomputes each window's argmax from x (first maximum wins, as
// in the forward), so the forward need not store indices.
#pragma once

#include <cstdint>

namespace memtrain::cpu {

struct Pool2dShape {
  int64_t planes, H, W;
  int64_t kernel, stride, padding;
  int64_t OH, OW;
};

template <typename T>
void max_pool2d_forward(T* out, const T* x, const Pool2dShape& s);  // out (planes, OH, OW)
template <typename T>
void max_pool2d_backward(T* dx, const T* dout, const T* x, const Pool2dShape& s);  // dx overwritten
template <typename T>
void avg_pool2d_forward(T* out, const T* x, const Pool2dShape& s);
template <typename T>
void avg_pool2d_backward(T* dx, const T* dout, const Pool2dShape& s);

}  // namespace memtrain::cpu
