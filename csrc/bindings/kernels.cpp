// Kernel entry points. Each takes tensors (via tensor_arg) and a stream handle; outputs are
// tensors the caller allocated (the core never allocates). Optional tensors are None.
#include <pybind11/pybind11.h>

#include <vector>

#include "bindings/registry.h"
#include "bindings/tensor_arg.h"
#include "kernels/activation.h"
#include "kernels/amax.h"
#include "kernels/block_scaling.h"
#include "kernels/cast.h"
#include "kernels/dequantize.h"
#include "kernels/mxfp8.h"
#include "kernels/reduce.h"
#include "kernels/scale.h"
#include "kernels/transpose.h"

namespace py = pybind11;

namespace overlap::bindings {

namespace {

// The four optional outputs of a block-scaled quantization, converted while holding the GIL.
struct QuantizedOutputRefs {
  std::optional<TensorRef> rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv;

  QuantizedOutputRefs(py::handle rd, py::handle rs, py::handle cd, py::handle cs)
      : rowwise_data(optional_tensor_ref_from_py(rd, "rowwise_data")),
        rowwise_scale_inv(optional_tensor_ref_from_py(rs, "rowwise_scale_inv")),
        columnwise_data(optional_tensor_ref_from_py(cd, "columnwise_data")),
        columnwise_scale_inv(optional_tensor_ref_from_py(cs, "columnwise_scale_inv")) {}

  kernels::QuantizedOutputs view() const {
    return {ptr(rowwise_data), ptr(rowwise_scale_inv), ptr(columnwise_data),
            ptr(columnwise_scale_inv)};
  }
};

void register_block_quantize(py::module_& k, const char* name, kernels::BlockShape shape,
                             const char* doc) {
  k.def(
      name,
      [shape](py::handle x, py::handle rowwise_data, py::handle rowwise_scale_inv,
              py::handle columnwise_data, py::handle columnwise_scale_inv, py::handle fp8_dtype,
              bool power_of_2, float epsilon, std::uintptr_t stream) {
        const TensorRef xr = tensor_ref_from_py(x, "x");
        const QuantizedOutputRefs outs(rowwise_data, rowwise_scale_inv, columnwise_data,
                                       columnwise_scale_inv);
        const DType fmt = dtype_from_py(fp8_dtype, "fp8_dtype");
        kernels::BlockScalingOptions options;
        options.power_of_2 = power_of_2;
        options.epsilon = epsilon;
        py::gil_scoped_release release;
        kernels::quantize_block(xr, shape, outs.view(), fmt, options, stream_from_py(stream));
      },
      py::arg("x"), py::kw_only(), py::arg("rowwise_data") = py::none(),
      py::arg("rowwise_scale_inv") = py::none(), py::arg("columnwise_data") = py::none(),
      py::arg("columnwise_scale_inv") = py::none(), py::arg("fp8_dtype"),
      py::arg("power_of_2") = false, py::arg("epsilon") = 0.0f, py::arg("stream") = 0, doc);
}

}  // namespace

void register_kernels(py::module_& m) {
  py::module_ k = m.def_submodule("kernels", "Quantization, reduction and activation kernels.");
  k.def(
      "amax",
      [](py::handle x, py::handle out, std::uintptr_t stream) {
        const TensorRef xr = tensor_ref_from_py(x, "amax input");
        const TensorRef outr = tensor_ref_from_py(out, "amax out");
        py::gil_scoped_release release;
        kernels::amax(xr, outr, stream_from_py(stream));
      },
      py::arg("x"), py::arg("out"), py::kw_only(), py::arg("stream") = 0,
      "out[0] = max(|x|) (NaN propagates). x: contiguous fp32/fp16/bf16 on cpu or cuda; "
      "out: float32[1] on the same device; stream: CUDA stream handle (ignored on cpu).");

  k.def(
      "compute_scale",
      [](py::handle amax, py::handle scale, py::handle scale_inv, py::handle fp8_dtype, int margin,
         bool power_of_2, float epsilon, std::uintptr_t stream) {
        const TensorRef a = tensor_ref_from_py(amax, "amax");
        const TensorRef s = tensor_ref_from_py(scale, "scale");
        const TensorRef si = tensor_ref_from_py(scale_inv, "scale_inv");
        const DType fmt = dtype_from_py(fp8_dtype, "fp8_dtype");
        kernels::ScaleOptions options;
        options.margin = margin;
        options.power_of_2 = power_of_2;
        options.epsilon = epsilon;
        py::gil_scoped_release release;
        kernels::compute_scale(a, s, si, fmt, options, stream_from_py(stream));
      },
      py::arg("amax"), py::arg("scale"), py::arg("scale_inv"), py::kw_only(), py::arg("fp8_dtype"),
      py::arg("margin") = 0, py::arg("power_of_2") = false, py::arg("epsilon") = 0.0f,
      py::arg("stream") = 0,
      "scale[i], scale_inv[i] from amax[i] (float32, n elements each); see kernels/scale.h.");

  k.def(
      "cast_to_fp8",
      [](py::handle x, py::handle scale, py::handle out, py::handle scale_inv, py::handle fp8_dtype,
         py::handle amax, std::uintptr_t stream) {
        const TensorRef xr = tensor_ref_from_py(x, "x");
        const TensorRef s = tensor_ref_from_py(scale, "scale");
        const TensorRef o = tensor_ref_from_py(out, "out");
        const TensorRef si = tensor_ref_from_py(scale_inv, "scale_inv");
        const auto a = optional_tensor_ref_from_py(amax, "amax");
        const DType fmt = dtype_from_py(fp8_dtype, "fp8_dtype");
        py::gil_scoped_release release;
        kernels::cast_to_fp8(xr, s, o, si, ptr(a), fmt, stream_from_py(stream));
      },
      py::arg("x"), py::arg("scale"), py::arg("out"), py::arg("scale_inv"), py::kw_only(),
      py::arg("fp8_dtype"), py::arg("amax") = py::none(), py::arg("stream") = 0,
      "out = fp8(x * scale[0]), scale_inv[0] = 1 / scale[0], amax[0] = max|x| if given.");

  k.def(
      "cast_transpose",
      [](py::handle x, py::handle scale, py::handle out, py::handle out_t, py::handle scale_inv,
         py::handle fp8_dtype, py::handle amax, std::uintptr_t stream) {
        const TensorRef xr = tensor_ref_from_py(x, "x");
        const TensorRef s = tensor_ref_from_py(scale, "scale");
        const auto o = optional_tensor_ref_from_py(out, "out");
        const auto ot = optional_tensor_ref_from_py(out_t, "out_t");
        const TensorRef si = tensor_ref_from_py(scale_inv, "scale_inv");
        const auto a = optional_tensor_ref_from_py(amax, "amax");
        const DType fmt = dtype_from_py(fp8_dtype, "fp8_dtype");
        py::gil_scoped_release release;
        kernels::cast_transpose(xr, s, ptr(o), ptr(ot), si, ptr(a), fmt, stream_from_py(stream));
      },
      py::arg("x"), py::arg("scale"), py::arg("out"), py::arg("out_t"), py::arg("scale_inv"),
      py::kw_only(), py::arg("fp8_dtype"), py::arg("amax") = py::none(), py::arg("stream") = 0,
      "cast_to_fp8 into out [rows, cols] and/or its transpose out_t [cols, rows] (either may be "
      "None).");

  k.def(
      "transpose_fp8",
      [](py::handle x, py::handle out, std::uintptr_t stream) {
        const TensorRef xr = tensor_ref_from_py(x, "x");
        const TensorRef o = tensor_ref_from_py(out, "out");
        py::gil_scoped_release release;
        kernels::transpose_fp8(xr, o, stream_from_py(stream));
      },
      py::arg("x"), py::arg("out"), py::kw_only(), py::arg("stream") = 0,
      "out [cols, rows] = x [rows, cols]^T for FP8 data (uint8 or an FP8 dtype).");

  register_block_quantize(k, "quantize_block_1x128", kernels::BlockShape::k1x128,
                          "1x128 block-scaled FP8; layouts in kernels/block_scaling.h.");
  register_block_quantize(k, "quantize_block_128x128", kernels::BlockShape::k128x128,
                          "128x128 block-scaled FP8; layouts in kernels/block_scaling.h.");

  k.def(
      "quantize_mxfp8",
      [](py::handle x, py::handle rowwise_data, py::handle rowwise_scale_inv,
         py::handle columnwise_data, py::handle columnwise_scale_inv, py::handle fp8_dtype,
         std::uintptr_t stream) {
        const TensorRef xr = tensor_ref_from_py(x, "x");
        const QuantizedOutputRefs outs(rowwise_data, rowwise_scale_inv, columnwise_data,
                                       columnwise_scale_inv);
        const DType fmt = dtype_from_py(fp8_dtype, "fp8_dtype");
        py::gil_scoped_release release;
        kernels::quantize_mxfp8(xr, outs.view(), fmt, stream_from_py(stream));
      },
      py::arg("x"), py::kw_only(), py::arg("rowwise_data") = py::none(),
      py::arg("rowwise_scale_inv") = py::none(), py::arg("columnwise_data") = py::none(),
      py::arg("columnwise_scale_inv") = py::none(), py::arg("fp8_dtype"), py::arg("stream") = 0,
      "MXFP8 (1x32 rowwise, 32x1 columnwise, E8M0 bytes); layouts in kernels/mxfp8.h.");

  k.def(
      "dequantize",
      [](py::handle data, py::handle scale_inv, py::handle out, py::handle fp8_dtype,
         std::uintptr_t stream) {
        const TensorRef d = tensor_ref_from_py(data, "data");
        const TensorRef si = tensor_ref_from_py(scale_inv, "scale_inv");
        const TensorRef o = tensor_ref_from_py(out, "out");
        const DType fmt = dtype_from_py(fp8_dtype, "fp8_dtype");
        py::gil_scoped_release release;
        kernels::dequantize(d, si, o, fmt, stream_from_py(stream));
      },
      py::arg("data"), py::arg("scale_inv"), py::arg("out"), py::kw_only(), py::arg("fp8_dtype"),
      py::arg("stream") = 0, "Per-tensor: out = float(data) * scale_inv[0].");

  k.def(
      "dequantize_blocks",
      [](py::handle data, py::handle scale_inv, py::handle out, py::handle fp8_dtype,
         std::int64_t block_rows, std::int64_t block_cols, std::uintptr_t stream) {
        const TensorRef d = tensor_ref_from_py(data, "data");
        const TensorRef si = tensor_ref_from_py(scale_inv, "scale_inv");
        const TensorRef o = tensor_ref_from_py(out, "out");
        const DType fmt = dtype_from_py(fp8_dtype, "fp8_dtype");
        py::gil_scoped_release release;
        kernels::dequantize_blocks(d, si, o, fmt, block_rows, block_cols, stream_from_py(stream));
      },
      py::arg("data"), py::arg("scale_inv"), py::arg("out"), py::kw_only(), py::arg("fp8_dtype"),
      py::arg("block_rows"), py::arg("block_cols"), py::arg("stream") = 0,
      "Block-scaled: float32 scale_inv per block, or uint8 E8M0 bytes (MXFP8).");

  k.def(
      "reduce_partials",
      [](py::handle partials, py::handle out, py::handle out_format, py::handle scale,
         py::handle scale_inv, py::handle amax, std::uintptr_t stream) {
        const TensorRef p = tensor_ref_from_py(partials, "partials");
        const TensorRef o = tensor_ref_from_py(out, "out");
        const DType fmt = dtype_from_py(out_format, "out_format");
        const auto s = optional_tensor_ref_from_py(scale, "scale");
        const auto si = optional_tensor_ref_from_py(scale_inv, "scale_inv");
        const auto a = optional_tensor_ref_from_py(amax, "amax");
        py::gil_scoped_release release;
        kernels::reduce_partials(p, o, fmt, ptr(s), ptr(si), ptr(a), stream_from_py(stream));
      },
      py::arg("partials"), py::arg("out"), py::kw_only(), py::arg("out_format"),
      py::arg("scale") = py::none(), py::arg("scale_inv") = py::none(),
      py::arg("amax") = py::none(), py::arg("stream") = 0,
      "out = sum of partials[0..k) in float32 (in order), rounded to out_format (FP8: "
      "fp8(sum * scale)); amax = max|sum|.");

  k.def(
      "reduce_tensors",
      [](const py::sequence& inputs, py::handle out, py::handle out_format, py::handle scale,
         py::handle scale_inv, py::handle amax, int max_blocks, std::uintptr_t stream) {
        std::vector<TensorRef> ins;
        for (py::handle t : inputs) ins.push_back(tensor_ref_from_py(t, "inputs"));
        const TensorRef o = tensor_ref_from_py(out, "out");
        const DType fmt = dtype_from_py(out_format, "out_format");
        const auto s = optional_tensor_ref_from_py(scale, "scale");
        const auto si = optional_tensor_ref_from_py(scale_inv, "scale_inv");
        const auto a = optional_tensor_ref_from_py(amax, "amax");
        py::gil_scoped_release release;
        kernels::reduce_tensors(ins, o, fmt, ptr(s), ptr(si), ptr(a), max_blocks,
                                stream_from_py(stream));
      },
      py::arg("inputs"), py::arg("out"), py::kw_only(), py::arg("out_format"),
      py::arg("scale") = py::none(), py::arg("scale_inv") = py::none(),
      py::arg("amax") = py::none(), py::arg("max_blocks") = 0, py::arg("stream") = 0,
      "reduce_partials over a list of separate tensors (on CUDA: reduce_pointers_cuda, the "
      "reduce-scatter's kernel, at most 64 inputs); max_blocks bounds the CUDA grid.");

  k.def(
      "swiglu_forward",
      [](py::handle h, py::handle out, std::uintptr_t stream) {
        const TensorRef hr = tensor_ref_from_py(h, "h");
        const TensorRef o = tensor_ref_from_py(out, "out");
        py::gil_scoped_release release;
        kernels::swiglu_forward(hr, o, stream_from_py(stream));
      },
      py::arg("h"), py::arg("out"), py::kw_only(), py::arg("stream") = 0,
      "out [rows, cols] = silu(h[:, :cols]) * h[:, cols:] for h [rows, 2 * cols] (fp32/fp16/"
      "bf16, float32 math); see kernels/activation.h.");

  k.def(
      "swiglu_backward",
      [](py::handle da, py::handle h, py::handle dh, std::uintptr_t stream) {
        const TensorRef dar = tensor_ref_from_py(da, "da");
        const TensorRef hr = tensor_ref_from_py(h, "h");
        const TensorRef dhr = tensor_ref_from_py(dh, "dh");
        py::gil_scoped_release release;
        kernels::swiglu_backward(dar, hr, dhr, stream_from_py(stream));
      },
      py::arg("da"), py::arg("h"), py::arg("dh"), py::kw_only(), py::arg("stream") = 0,
      "dh [rows, 2 * cols] = [d gate | d up] of swiglu_forward, from da [rows, cols] and h.");
}

}  // namespace overlap::bindings
