// SwiGLU, forward and backward, fused: the gated activation of a transformer MLP.
//
// NOTE [fused swiglu]: LayerNormMLP's fc1 writes h [rows, 2 * cols], the gate columns first
// and the up columns after them (its weight is [gate_r; up_r]), and the activation is
//
//   a = silu(g) * u,   silu(g) = g * sigmoid(g),   g = h[:, :cols], u = h[:, cols:].
//
// In PyTorch, g and u are strided views of h (h.chunk(2, dim=-1)), so silu and the product run
// on its non-vectorized elementwise kernels, two in forward and two or three in backward, and
// the backward ends in a cat of dg and du into dh. Each of those passes reads or writes a
// [rows, cols] tensor. The fused kernels here read h once and write a once, and in backward
// read da and h once and write dh [rows, 2 * cols] directly, with 16-byte vectors: the
// activation becomes the memory traffic it needs and nothing more (bf16, T = 8192 tokens,
// F/tp = 14336: 0.7 GB forward, 1.2 GB backward). Not yet measured on a GPU.
//
// The math is float32 for every input dtype (one rounding, to the output dtype, at the end):
//
//   s  = 1 / (1 + exp(-g))
//   a  = (g * s) * u
//   dg = da * u * s * (1 + g * (1 - s))       (d silu / dg = s * (1 + g * (1 - s)))
//   du = da * (g * s)
//
// the formulas of torch's silu and its backward. Unlike the quantization kernels (NOTE
// [bit-exact kernels] in device_utils.cuh), the CUDA kernels and the host reference are not
// bit-exact against each other: neither exp is correctly rounded (the device's expf, the
// host's own vectorizable one, NOTE [host swiglu loops] in activation.cpp), so the float32
// results may differ in their last bits, and a 16-bit output by one unit in the last place
// where the float32 value lies next to a rounding boundary. Both stay within a few units of
// the float32 rounding of the exact result, as torch's own silu does.
#pragma once

#include <cstdint>

#include "common/stream.h"
#include "common/tensor_ref.h"

namespace overlap::kernels {

// h: contiguous 2-D [rows, 2 * cols] float32/float16/bfloat16 (gate columns, then up
// columns). out: contiguous [rows, cols] of h's dtype, not sharing memory with h. Both on one
// device: host tensors run the host reference, CUDA tensors the kernel on `stream` (no host
// sync). Every argument is checked before any work (InvalidArgumentError).
void swiglu_forward(const TensorRef& h, const TensorRef& out, cudaStream_t stream);

// da: contiguous [rows, cols], the gradient of swiglu_forward's output. h: its input
// [rows, 2 * cols]. dh: contiguous [rows, 2 * cols] receiving [dg | du], sharing memory with
// neither. One dtype (float32/float16/bfloat16) and one device for all three.
void swiglu_backward(const TensorRef& da, const TensorRef& h, const TensorRef& dh,
                     cudaStream_t stream);

// Host references (also the CPU path of the layers): row-major buffers of `dtype`, shapes as
// above.
void swiglu_forward_host(const void* h, DType dtype, std::int64_t rows, std::int64_t cols,
                         void* out);
void swiglu_backward_host(const void* da, const void* h, DType dtype, std::int64_t rows,
                          std::int64_t cols, void* dh);

#ifdef OVERLAP_WITH_CUDA
// Device pointers, shapes as above, on the current device; enqueued on `stream`. 16-byte
// vectors when cols is a multiple of the vector width and every pointer is 16-byte aligned,
// one element at a time otherwise (NOTE [vector and scalar paths] in device_utils.cuh).
void swiglu_forward_cuda(const void* h, DType dtype, std::int64_t rows, std::int64_t cols,
                         void* out, cudaStream_t stream);
void swiglu_backward_cuda(const void* da, const void* h, DType dtype, std::int64_t rows,
                          std::int64_t cols, void* dh, cudaStream_t stream);
#endif

}  // namespace overlap::kernels
