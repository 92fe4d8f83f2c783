// GEMM entry points (overlap._C.gemm). The Python wrapper (overlap/gemm.py) allocates the
// output and picks the stream; the core validates everything. The wrapper passes gemm()'s
// arguments positionally, in this order (NOTE [gemm host path] in overlap/gemm.py).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <utility>

#include "bindings/registry.h"
#include "bindings/tensor_arg.h"
#include "common/errors.h"
#include "gemm/gemm.h"

namespace py = pybind11;

namespace overlap::bindings {

namespace {

const char* tune_status_name(gemm::TuneStatus status) {
  switch (status) {
    case gemm::TuneStatus::kCached:
      return "cached";
    case gemm::TuneStatus::kTuned:
      return "tuned";
    case gemm::TuneStatus::kUntuned:
      return "untuned";
  }
  return "unknown";
}

py::dict autotune_to_py(const gemm::AutotuneConfig& c) {
  py::dict d;
  d["enabled"] = c.enabled;
  d["max_candidates"] = c.max_candidates;
  d["rounds"] = c.rounds;
  return d;
}

}  // namespace

void register_gemm(py::module_& m) {
  py::module_ g = m.def_submodule("gemm", "Row-major GEMM: cuBLASLt on CUDA, reference on CPU.");
  // The bounds of the autotuning configuration (gemm.h); overlap.gemm validates against these.
  g.attr("MAX_AUTOTUNE_CANDIDATES") = gemm::kMaxAutotuneCandidates;
  g.attr("MAX_AUTOTUNE_ROUNDS") = gemm::kMaxAutotuneRounds;
  // How an operand's scale_inv maps onto its data (gemm.h): overlap.dtypes.ScalingMode crosses
  // the binding as one of these (both MXFP8 directions as MXFP8, which the GEMM refuses).
  py::enum_<gemm::ScalingMode>(g, "ScalingMode", "An operand's scaling (csrc/gemm/gemm.h).")
      .value("NONE", gemm::ScalingMode::kNone)
      .value("TENSOR", gemm::ScalingMode::kTensor)
      .value("BLOCK_1X128", gemm::ScalingMode::kBlock1x128)
      .value("BLOCK_128X128", gemm::ScalingMode::kBlock128x128)
      .value("MXFP8", gemm::ScalingMode::kMxfp8);
  g.def(
      "gemm",
      [](py::handle a, py::handle b, py::handle out, bool transa, bool transb,
         py::handle a_scale_inv, py::handle b_scale_inv, gemm::ScalingMode a_scaling,
         gemm::ScalingMode b_scaling, float alpha, float beta, py::handle bias, bool gelu,
         py::handle out_scale, py::handle out_amax, bool fast_accum, int sm_count,
         std::int64_t row_offset, std::uintptr_t stream, int tune_candidates,
         int tune_rounds) -> py::object {
        const TensorRef ar = tensor_ref_from_py(a, "a");
        const TensorRef br = tensor_ref_from_py(b, "b");
        const TensorRef outr = tensor_ref_from_py(out, "out");
        const auto asi = optional_tensor_ref_from_py(a_scale_inv, "a_scale_inv");
        const auto bsi = optional_tensor_ref_from_py(b_scale_inv, "b_scale_inv");
        const auto biasr = optional_tensor_ref_from_py(bias, "bias");
        const auto os = optional_tensor_ref_from_py(out_scale, "out_scale");
        const auto oa = optional_tensor_ref_from_py(out_amax, "out_amax");
        gemm::GemmTensorOptions o;
        o.transa = transa;
        o.transb = transb;
        o.a_scaling = a_scaling;
        o.b_scaling = b_scaling;
        o.row_offset = row_offset;
        o.options.alpha = alpha;
        o.options.beta = beta;
        o.options.gelu = gelu;
        o.options.fast_accum = fast_accum;
        o.options.sm_count = sm_count;
        const gemm::GemmTensors t{&ar,      &br,        &outr,   ptr(asi),
                                  ptr(bsi), ptr(biasr), ptr(os), ptr(oa)};
        if (tune_candidates == 0) {
          py::gil_scoped_release release;
          gemm::gemm(t, o, stream_from_py(stream));
          return py::none();
        }
        gemm::GemmTuneRecord record;
        const gemm::TuneRequest request{{true, tune_candidates, tune_rounds}, &record};
        gemm::validate_autotune_config(request.config);
        {
          py::gil_scoped_release release;
          gemm::gemm(t, o, stream_from_py(stream), &request);
        }
        py::dict r;
        r["status"] = tune_status_name(record.status);
        r["chosen"] = record.chosen;
        py::list times;
        for (double ms : record.times_ms) times.append(ms);
        r["times_ms"] = times;
        r["note"] = record.note;
        return std::move(r);
      },
      py::arg("a"), py::arg("b"), py::arg("out"), py::arg("transa") = false,
      py::arg("transb") = false, py::arg("a_scale_inv") = py::none(),
      py::arg("b_scale_inv") = py::none(), py::arg("a_scaling") = gemm::ScalingMode::kNone,
      py::arg("b_scaling") = gemm::ScalingMode::kNone, py::arg("alpha") = 1.0f,
      py::arg("beta") = 0.0f, py::arg("bias") = py::none(), py::arg("gelu") = false,
      py::arg("out_scale") = py::none(), py::arg("out_amax") = py::none(),
      py::arg("fast_accum") = false, py::arg("sm_count") = 0, py::arg("row_offset") = 0,
      py::arg("stream") = 0, py::arg("tune_candidates") = 0, py::arg("tune_rounds") = 0,
      "out[row_offset:row_offset+m] = epilogue(alpha op(a) @ op(b) + beta out + bias); see "
      "csrc/gemm/gemm.h. tune_candidates > 0: tune the key first with that many candidates and "
      "tune_rounds rounds, whatever the process-wide setting, and return what tuning did (a "
      "dict: status, chosen, times_ms, note); otherwise None.");
  g.def(
      "set_autotune",
      [](bool enabled, int max_candidates, int rounds) {
        gemm::gemm_set_autotune({enabled, max_candidates, rounds});
      },
      py::arg("enabled"), py::arg("max_candidates"), py::arg("rounds"),
      "Process-wide lazy autotuning of new GEMM keys (validated; ConfigError).");
  g.def(
      "get_autotune", [] { return autotune_to_py(gemm::gemm_autotune()); },
      "The process-wide autotuning configuration: enabled, max_candidates, rounds.");
  g.def(
      "cache_stats",
      [](int device) {
        const gemm::GemmCacheStats s = gemm::gemm_cache_stats(device);
        py::dict d;
        d["hits"] = s.hits;
        d["misses"] = s.misses;
        d["entries"] = s.entries;
        d["tuned"] = s.tuned;
        return d;
      },
      py::arg("device"), "Algorithm-cache counters of a device: hits, misses, entries, tuned.");
  g.def("clear_cache", &gemm::gemm_clear_cache, "Drop every cached cuBLASLt algorithm.");
  g.def("waiting_gemm_built", &gemm::waiting_gemm_built,
        "Whether this build holds the waiting grouped GEMM (NOTE [waiting gemm]; CUTLASS).");
  g.def(
      "waiting_gemm_choices",
      [] {
        py::list out;
        for (const gemm::WaitingGemmChoice& c : gemm::waiting_gemm_choices()) {
          py::dict d;
          d["problem"] = c.problem;
          d["kernel"] = c.kernel;
          d["tuned"] = c.tuned;
          d["estimate_ms"] = c.estimate_ms;
          d["candidates"] = c.candidates;
          d["all_ms"] = c.all_ms;
          d["last_ms"] = c.last_ms;
          d["note"] = c.note;
          out.append(d);
        }
        return out;
      },
      "The waiting GEMM's kernel per problem this process ran (NOTE [waiting gemm choice]): "
      "problem, kernel, tuned, estimate_ms, candidates, all_ms, last_ms (0: not timed), note.");
  g.def("waiting_gemm_candidates", &gemm::waiting_gemm_candidates,
        "The waiting GEMM's candidate kernels, in the tuner's order (empty without the kernel).");
  g.def("set_waiting_gemm_kernel", &gemm::set_waiting_gemm_kernel, py::arg("name"),
        "Override the waiting GEMM's measured choice process-wide: '' measures, 'untuned' the "
        "untuned rule, else a candidate's name (ConfigError otherwise). Returns the previous.");
  g.def("waiting_gemm_kernel", &gemm::waiting_gemm_kernel,
        "The override of the waiting GEMM's choice ('' when measured).");
  g.def(
      "release_resources",
      [] {
        py::gil_scoped_release release;
        gemm::gemm_release_resources();
      },
      "Synchronise and release each device's cuBLASLt handle, scratch pool and cache.");
}

}  // namespace overlap::bindings
