// Neural-network ops with fused forward and hand-written backward. Shapes in comments: B batch, T time,
// C channels, H heads, D head dim, N rows, V classes.
#pragma once

#include "memtrain/core/tensor.h"

#include <cstdint>

namespace memtrain::ops {

Tensor softmax(const Tensor& x, std::int64_t dim = -1);
Tensor log_softmax(const Tensor& x, std::int64_t dim = -1);

// Normalises over the last dim. weight, bias: [C] (either may be undefined).
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);

// Batch norm over x [B, C, H, W] per channel; weight, bias, running_mean, running_var [C] (weight/bias may be
// undefined: 1 / 0). training: batch statistics (the biased variance normalises) and, when update_running, the
// running statistics move by momentum (unbiased variance), outside the graph; eval: the running statistics as
// constants. Gradients flow to x, weight and bias. A device whose backend has fused kernels (CUDA) runs those;
// elsewhere (CPU, meta) it composes differentiable ops. nn::BatchNorm2d calls it.
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum, double eps, bool update_running);

// weight [V, C], indices integer [...] -> [..., C]. Indices outside [0, V) throw.
Tensor embedding(const Tensor& weight, const Tensor& indices);
// weight_grad [V, C] += the rows of dout [..., C] scattered by indices [...] (no autograd): the embedding's own
// backward, for a gradient that reaches the table from elsewhere (a pipeline's tied embedding, whose lookup ran
// on another stage). weight_grad is written in place, in its dtype; dout must have the same dtype.
void embedding_scatter_add_(Tensor& weight_grad, const Tensor& dout, const Tensor& indices);

enum class Reduction { mean, sum, none };
// logits [N, V], targets integer [N] -> scalar (mean over non-ignored targets, or sum) or [N] (none).
// Fused log-softmax + negative log-likelihood; targets equal to ignore_index contribute nothing.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, Reduction reduction = Reduction::mean,
                     std::int64_t ignore_index = -100);
// input, target [...] of one shape (no broadcasting) -> scalar (mean or sum over all elements) or [...] (none).
// mse: (input - target)^2; l1: |input - target| (its gradient at input == target is 0). Composed of
// differentiable ops, so they run on every backend and the target gets a gradient too when it requires one.
// Under autocast they run in f32, as cross_entropy does.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::mean);
Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::mean);

// Zeroes each element with probability p and scales the rest by 1/(1-p); identity when !training or p == 0.
// Draws from the default RNG stream (reproducible under RngStateGuard / checkpoint recomputation).
Tensor dropout(const Tensor& x, double p, bool training = true);

// q, k, v [B, H, T, D] -> [B, H, T, D]. Causal attention with scale 1/sqrt(D), computed in tiles with an
// online softmax so the T x T score matrix is never stored; backward recomputes the tiles (flash attention)
// from q, k, v, the output and the per-row log-sum-exp.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = true);

// x [B, Cin, H, W], weight [Cout, Cin/groups, KH, KW], bias [Cout] or undefined.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, std::int64_t stride = 1,
              std::int64_t padding = 0, std::int64_t groups = 1);
Tensor max_pool2d(const Tensor& x, std::int64_t kernel, std::int64_t stride = 0, std::int64_t padding = 0);
Tensor avg_pool2d(const Tensor& x, std::int64_t kernel, std::int64_t stride = 0, std::int64_t padding = 0);

}  // namespace memtrain::ops
