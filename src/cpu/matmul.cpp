// The CPU backend's matmul and linear entries over the GEMM kernels of cpu/gemm.h (oneDNN, Eigen or the
// built-in blocked kernel). Operands are read through their strides (core/matrix_operand.h).
#include "cpu/cpu_backend.h"
#include "cpu/gemm.h"
#include "core/matrix_operand.h"

#include <algorithm>
#include <cstdint>

namespace memtrain::cpu {

namespace {

using ::memtrain::detail::as_operand;
using ::memtrain::detail::MatrixOperand;

// out [batch, m, n] (contiguous) = a [batch, m, k] x b [batch|1, k, n] + beta * out; compute in the kernel's
// dtype. `run` false (meta): only the contiguous copies of operands the GEMM cannot read are made.
void gemm_cpu(const Tensor& a, const Tensor& b, const Tensor& out, std::int64_t batch, double beta, bool run) {
  const std::int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const MatrixOperand A = as_operand(a), B = as_operand(b);
  if (!run) return;
  std::int64_t stride_b = b.dim() == 2 ? 0 : B.batch_stride;
  std::int64_t stride_c = m * n;
  std::int64_t rows = m;
  // One shared B (a weight, e.g. the tied LM head) and A's matrices stacked row after row: one GEMM of
  // batch * m rows instead of `batch` GEMMs that would each pack B again.
  if (batch > 1 && stride_b == 0 && !A.trans && A.batch_stride == m * A.ld) {
    rows = batch * m;
    batch = 1;
    stride_c = 0;
  }
  switch (a.dtype()) {
    case DType::f32:
      gemm_batched_f32(A.trans, B.trans, rows, n, k, 1.0f, A.tensor.data<float>(), A.ld, B.tensor.data<float>(), B.ld,
                       static_cast<float>(beta), out.data<float>(), n, batch, A.batch_stride, stride_b, stride_c);
      return;
    case DType::f64:
      gemm_batched_f64(A.trans, B.trans, rows, n, k, 1.0, A.tensor.data<double>(), A.ld, B.tensor.data<double>(), B.ld,
                       beta, out.data<double>(), n, batch, A.batch_stride, stride_b, stride_c);
      return;
    case DType::bf16:
      gemm_batched_bf16(A.trans, B.trans, rows, n, k, 1.0f, A.tensor.data<std::uint16_t>(), A.ld,
                        B.tensor.data<std::uint16_t>(), B.ld, static_cast<float>(beta), out.data<float>(), n, batch,
                        A.batch_stride, stride_b, stride_c);
      return;
    default:
      MT_CHECK(false, "matmul", "no CPU GEMM for {}", dtype_name(a.dtype()));
  }
}

bool is_narrow(DType t) { return t == DType::bf16 || t == DType::f16; }

// Narrow (bf16/f16) products on the CPU accumulate in f32, but the f32 result exists one slab of rows at a
// time (at most kNarrowSlabElements floats), each slab rounded into the narrow output: mixed precision keeps
// activations narrow to halve them, and an f32 copy of a whole [N, 4C] output (plus a separate bias add) would
// give that saving back at the forward's peak. Slabs are few and even (each GEMM call re-packs the other
// operand): GPT-2's [1024, 3072] MLP output runs as two GEMMs of 512 rows.
constexpr std::int64_t kNarrowSlabElements = std::int64_t{1} << 21;  // 8 MiB of f32

// Rows per slab: the fewest slabs of at most `limit` elements, rows split evenly, a multiple of 16 rows.
std::int64_t even_slab_rows(std::int64_t rows, std::int64_t row_elements, std::int64_t limit) {
  const std::int64_t per_slab = std::max<std::int64_t>(1, limit / std::max<std::int64_t>(row_elements, 1));
  const std::int64_t slabs = (rows + per_slab - 1) / per_slab;
  const std::int64_t even = (rows + slabs - 1) / slabs;
  return std::min(rows, std::min(per_slab, (even + 15) / 16 * 16));
}

// out [rows, n] (narrow, contiguous) = a [rows, k] x b [k, n] (+ bias [n], added to the f32 accumulator, so
// each element is rounded once). bf16 runs natively in the GEMM; f16 operands are widened (b once, a per slab).
// Every temporary lives on a's device; `run` false (meta) allocates them and skips the GEMMs.
void narrow_gemm_rows(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& out, bool run) {
  const std::int64_t rows = a.size(0), n = b.size(1);
  const bool native = a.dtype() == DType::bf16;
  const Tensor bw = native ? b.detach() : b.detach().to(DType::f32);
  const Tensor bias_row = bias.defined() ? bias.detach().to(DType::f32).reshape({1, n}) : Tensor();
  const std::int64_t slab = even_slab_rows(rows, n, kNarrowSlabElements);
  const Tensor acc = Tensor::empty({slab, n}, DType::f32, a.device());
  for (std::int64_t r0 = 0; r0 < rows; r0 += slab) {
    const std::int64_t r = std::min(slab, rows - r0);
    Tensor y = acc.narrow(0, 0, r);
    if (bias_row.defined()) y.copy_(bias_row.expand({r, n}));
    const Tensor a_slab = a.detach().narrow(0, r0, r);
    const Tensor a_in = native ? a_slab : a_slab.to(DType::f32);
    gemm_cpu(a_in, bw, y, 1, bias_row.defined() ? 1.0 : 0.0, run);
    out.narrow(0, r0, r).copy_(y);
  }
}

}  // namespace

void CpuBackend::matmul(const Tensor& out, const Tensor& a, const Tensor& b) const {
  if (out.numel() == 0) return;
  const std::int64_t batch = out.numel() / (out.size(-2) * out.size(-1));
  if (is_narrow(a.dtype()) && b.dim() == 2 && (a.dim() == 2 || a.is_contiguous())) {
    narrow_gemm_rows(a.reshape({-1, a.size(-1)}), b, Tensor(), out.reshape({-1, b.size(1)}), runs_kernels());
    return;
  }
  const bool native = a.dtype() == DType::f32 || a.dtype() == DType::f64 || a.dtype() == DType::bf16;
  const Tensor x = native ? a : a.detach().to(DType::f32), y = native ? b : b.detach().to(DType::f32);
  const DType acc = a.dtype() == DType::f64 ? DType::f64 : DType::f32;
  // bf16 accumulates into f32 and f16 computes in f32: both are rounded into out once at the end.
  const Tensor c = out.dtype() == acc ? out : Tensor::empty(out.shape(), acc, out.device());
  gemm_cpu(x, y, c, batch, 0.0, runs_kernels());
  if (!c.shares_storage_with(out)) Tensor(out).copy_(c);
}

void CpuBackend::linear_forward(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias) const {
  const std::int64_t N = x.size(0), out_features = weight.size(0);
  if (is_narrow(x.dtype())) {
    narrow_gemm_rows(x, weight.detach().t(), bias, out, runs_kernels());
    return;
  }
  Tensor(out).copy_(bias.detach().reshape({1, out_features}).expand({N, out_features}));
  gemm_cpu(x.detach(), weight.detach().t(), out, 1, 1.0, runs_kernels());
}

// ---- gemm_f32 (the fused linear + cross-entropy walk's accumulating product) ----

void CpuBackend::gemm_f32(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                          double alpha, double beta) const {
  const ::memtrain::detail::GemmDims d = ::memtrain::detail::check_gemm_operands(out, a, b, trans_a, trans_b);
  // f16 has no CPU GEMM: its operands are widened (exactly) into f32 copies first.
  const bool widen = a.dtype() == DType::f16;
  // Transposed views are read in place: a column-major operand is its transpose stored row-major.
  const MatrixOperand A = as_operand(widen ? a.detach().to(DType::f32) : a);
  const MatrixOperand B = as_operand(widen ? b.detach().to(DType::f32) : b);
  if (!runs_kernels()) return;
  // Qualified: the member of the same name would hide the kernel.
  const bool ta = trans_a != A.trans, tb = trans_b != B.trans;
  if (A.tensor.dtype() == DType::bf16) {
    cpu::gemm_bf16(ta, tb, d.m, d.n, d.k, static_cast<float>(alpha), A.tensor.data<std::uint16_t>(), A.ld,
                   B.tensor.data<std::uint16_t>(), B.ld, static_cast<float>(beta), out.data<float>(), d.ldc);
    return;
  }
  cpu::gemm_f32(ta, tb, d.m, d.n, d.k, static_cast<float>(alpha), A.tensor.data<float>(), A.ld,
                B.tensor.data<float>(), B.ld, static_cast<float>(beta), out.data<float>(), d.ldc);
}

// bf16 runs oneDNN's bf16 GEMM (or cpu/gemm.h's blockwise widening where the CPU has no bf16 instructions);
// f16 would be widened whole.
bool CpuBackend::gemm_narrow_native(DType dtype) const { return dtype == DType::bf16; }

}  // namespace memtrain::cpu
