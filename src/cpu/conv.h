// 2-D convolution (NCHW), two paths:
//  - general: im2col + GEMM, one image and group at a time. For group g of image b:
//      col (Cin_g*KH*KW, OH*OW) = im2col(x[b, group g])
//      out[b, group g] (Cout_g, OH*OW) = W_g (Cout_g, Cin_g*KH*KW) x col  (+ bias)
//    Backward reuses the same column buffer: dW_g += dout_g x col^T, then col = W_g^T dout_g and col2im adds it
//    into dx. Images are split across OpenMP threads, each with its own column buffer in the workspace and its
//    own partial dW (summed in thread order at the end, so results are deterministic for a thread count).
//    1x1 convolutions with stride 1 and no padding read x directly (col == x).
//  - depthwise (Cin / groups == 1, any multiplier Cout / groups): direct loops. Each x plane is copied, zero-
//    padded, into per-thread scratch laid out so that every filter tap is one contiguous multiply-add pass over
//    the whole output plane (vectorised; a GEMM there would have a single row and K = KH*KW). Planes, and for dW
//    output channels, are split across threads, and each output element is summed by one thread in a fixed
//    order, so results do not depend on the thread count.
// conv2d_forward / conv2d_backward pick the path (or take the general one when asked). T is float or double.
#pragma once

#include <cstdint>

namespace memtrain::cpu {

struct Conv2dShape {
  int64_t B, Cin, H, W;      // input
  int64_t Cout, KH, KW;      // weight (Cout, Cin / groups, KH, KW)
  int64_t stride, padding, groups;
  int64_t OH, OW;            // output
};

// Output size of one spatial dim; <= 0 when the window does not fit.
inline int64_t conv_out_size(int64_t in, int64_t kernel, int64_t stride, int64_t padding) {
  return (in + 2 * padding - kernel) / stride + 1;
}

// Which path a call takes: the one the shape calls for, or the general one whatever the shape (im2col), so that
// bench_nn_ops and the tests can measure and check the depthwise loops against it on the same shapes.
enum class ConvPath { best, im2col };

// Elements of T scratch forward / backward need on `path` (exactly what they use: the meta backend predicts from
// these).
int64_t conv2d_forward_workspace(const Conv2dShape& s, int nthreads, ConvPath path = ConvPath::best);
int64_t conv2d_backward_workspace(const Conv2dShape& s, int nthreads, ConvPath path = ConvPath::best);

// out: (B, Cout, OH, OW); x: (B, Cin, H, W); weight: (Cout, Cin/groups, KH, KW); bias: (Cout) or null.
template <typename T>
void conv2d_forward(T* out, const T* x, const T* weight, const T* bias, const Conv2dShape& s, T* workspace,
                    int nthreads, ConvPath path = ConvPath::best);
// dx, dweight, dbias overwritten; any may be null (not needed).
template <typename T>
void conv2d_backward(T* dx, T* dweight, T* dbias, const T* dout, const T* x, const T* weight, const Conv2dShape& s,
                     T* workspace, int nthreads, ConvPath path = ConvPath::best);

}  // namespace memtrain::cpu
