// overlap._C.comm_ops: the comm-GEMM overlap ops (use overlap.ops instead). Tensors become
// GEMM operands here; the core validates everything before communicating.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings/registry.h"
#include "bindings/tensor_arg.h"
#include "comm/op_protocol.h"
#include "comm/overlap/overlap_ops.h"
#include "comm/symmetric_buffer.h"
#include "common/errors.h"
#include "kernels/kernel_args.h"

namespace py = pybind11;

namespace overlap::bindings {

namespace {

using comm::SymmetricBuffer;

// `t` lives where the buffer's transport works (any strides).
void check_device(const SymmetricBuffer& buf, const TensorRef& t, const char* op,
                  const char* what) {
  const int device = buf.transport().device();
  OVERLAP_CHECK_ARG(t.device == device,
                    op << ": " << what << " is " << t.describe() << ", but the buffer uses the "
                       << comm::transport_name(buf.transport().kind()) << " transport on "
                       << (device < 0 ? std::string("the cpu") : "cuda:" + std::to_string(device)));
}

// A 2-D tensor with unit column stride (and its float32[1] scale_inv when FP8) as an operand.
gemm::GemmOperand operand(const SymmetricBuffer& buf, const TensorRef& t,
                          const std::optional<TensorRef>& scale_inv, bool transposed,
                          const char* op, const char* what) {
  OVERLAP_CHECK_ARG(
      t.shape.size() == 2 && (t.shape[1] == 1 || t.strides[1] == 1),
      op << ": " << what << " must be a 2-D tensor with unit column stride, got " << t.describe());
  check_device(buf, t, op, what);
  gemm::GemmOperand x;
  x.data = t.data;
  x.dtype = t.dtype;
  x.rows = t.shape[0];
  x.cols = t.shape[1];
  x.ld = t.shape[0] == 1 ? t.shape[1] : t.strides[0];
  x.transposed = transposed;
  if (dtype_is_fp8(t.dtype)) {
    OVERLAP_CHECK_ARG(scale_inv.has_value(), op << ": the FP8 " << what << " needs its scale_inv");
    kernels::check_float32_elements(*scale_inv, 1, op, "scale_inv");
    buf.check_tensor(*scale_inv, "scale_inv");
    x.scaling = gemm::ScalingMode::kTensor;
    x.scale_inv = static_cast<const float*>(scale_inv->data);
  } else {
    OVERLAP_CHECK_ARG(!scale_inv.has_value(), op << ": " << what << " is not FP8: no scale_inv");
  }
  return x;
}

// The input and the weight of an op (transb: the weight is stored [n, k]).
std::pair<gemm::GemmOperand, gemm::GemmOperand> operands(const SymmetricBuffer& buf, py::handle a,
                                                         py::handle a_scale_inv, py::handle b,
                                                         py::handle b_scale_inv, bool transb,
                                                         const char* op) {
  const TensorRef ar = tensor_ref_from_py(a, "input");
  const TensorRef br = tensor_ref_from_py(b, "weight");
  return {operand(buf, ar, optional_tensor_ref_from_py(a_scale_inv, "input scale_inv"), false, op,
                  "input"),
          operand(buf, br, optional_tensor_ref_from_py(b_scale_inv, "weight scale_inv"), transb, op,
                  "weight")};
}

// A contiguous 2-D output.
gemm::GemmOutput output(const SymmetricBuffer& buf, const TensorRef& t, const char* op) {
  OVERLAP_CHECK_ARG(t.shape.size() == 2,
                    op << ": the output must be a 2-D tensor, got " << t.describe());
  buf.check_tensor(t, "the output");
  gemm::GemmOutput d;
  d.data = t.data;
  d.dtype = t.dtype;
  d.rows = t.shape[0];
  d.cols = t.shape[1];
  d.ld = t.shape[1];
  return d;
}

float* scalar(const SymmetricBuffer& buf, const std::optional<TensorRef>& t, const char* op,
              const char* what) {
  if (!t) return nullptr;
  kernels::check_float32_elements(*t, 1, op, what);
  buf.check_tensor(*t, what);
  return static_cast<float*>(t->data);
}

// A tuning struct of NOTE [overlap defaults] as a read-only Python class: its fields, FIELDS
// (their names, in order), a constructor giving the defaults of any size, equality and a repr.
template <typename C>
class ConfigClass {
 public:
  ConfigClass(py::module_& m, const char* name, const char* doc) : cls_(m, name, doc) {
    cls_.def(py::init<>(), "The defaults of any group size.");
  }
  template <typename T>
  ConfigClass& field(const char* name, T C::*member, const char* doc) {
    cls_.def_readonly(name, member, doc);
    names_.append(name);
    return *this;
  }
  void done() {
    const py::tuple names(names_);
    cls_.attr("FIELDS") = names;
    cls_.def("__eq__", [names](const py::object& self, const py::object& other) {
      if (!py::type::of(self).is(py::type::of(other))) return false;
      for (const auto& f : names) {
        if (!self.attr(f).equal(other.attr(f))) return false;
      }
      return true;
    });
    cls_.attr("__hash__") = py::none();
    cls_.def("__repr__", [names](const py::object& self) {
      std::string out = py::str(py::type::of(self).attr("__name__"));
      const char* sep = "(";
      for (const auto& f : names) {
        out += sep + std::string(py::str(f)) + "=" + std::string(py::repr(self.attr(f)));
        sep = ", ";
      }
      return out + ")";
    });
  }

 private:
  py::class_<C> cls_;
  py::list names_;
};

// The limits, tuning structs and defaults of NOTE [overlap defaults].
void register_tuning(py::module_& c) {
  c.attr("MAX_COMPUTE_LANES") = comm::kMaxComputeLanes;
  c.attr("MAX_PIECES") = comm::kMaxPieces;
  c.attr("MAX_RING_SUBCHUNKS") = comm::kMaxRingSubchunks;
  // A buffer's put_split (NOTE [put split] in symmetric_buffer.h): bound and default.
  c.attr("MAX_PUT_SPLIT") = SymmetricBuffer::kMaxPutSplit;
  c.attr("DEFAULT_PUT_SPLIT") = SymmetricBuffer::kDefaultPutSplit;
  c.attr("SLOT_ALIGNMENT") = comm::kSlotAlignment;
  py::enum_<comm::RsMethod>(c, "RsMethod", "How a GEMM -> RS moves and sums the partial sums.")
      .value("PIPELINED", comm::RsMethod::kPipelined, "gemm_rs: chunks pulled, one reduction")
      .value("RING", comm::RsMethod::kRing, "gemm_rs_ring: running sums travel the ring");
  ConfigClass<comm::AgGemmConfig>(c, "AgGemmConfig", "Tuning of ag_gemm (overlap_ops.h).")
      .field("compute_lanes", &comm::AgGemmConfig::compute_lanes, "streams of the chunk GEMMs")
      .field("staggered_puts", &comm::AgGemmConfig::staggered_puts, "one peer after the other")
      .field("pull_shards", &comm::AgGemmConfig::pull_shards, "the peers pull the shard")
      .field("pieces", &comm::AgGemmConfig::pieces, "pieces of each peer's shard")
      .field("keep_gathered", &comm::AgGemmConfig::keep_gathered, "the buffer keeps it whole")
      .field("fused_gemm", &comm::AgGemmConfig::fused_gemm, "one waiting GEMM (pulls only)")
      .done();
  ConfigClass<comm::GemmRsConfig>(c, "GemmRsConfig", "Tuning of gemm_rs (overlap_ops.h).")
      .field("compute_lanes", &comm::GemmRsConfig::compute_lanes, "streams of the chunk GEMMs")
      .field("reduce_max_blocks", &comm::GemmRsConfig::reduce_max_blocks, "reduction grid bound")
      .field("pieces", &comm::GemmRsConfig::pieces, "rounds of the chunks")
      .done();
  ConfigClass<comm::GemmRsRingConfig>(c, "GemmRsRingConfig",
                                      "Tuning of gemm_rs_ring (overlap_ops.h).")
      .field("compute_lanes", &comm::GemmRsRingConfig::compute_lanes, "streams of the GEMMs")
      .field("reduce_max_blocks", &comm::GemmRsRingConfig::reduce_max_blocks, "FP8 cast's grid")
      .field("ring_subchunks", &comm::GemmRsRingConfig::ring_subchunks, "sub-chunks per hop")
      .field("pull_shards", &comm::GemmRsRingConfig::pull_shards, "the successor pulls")
      .done();
  ConfigClass<comm::GemmRsDefault>(c, "GemmRsDefault",
                                   "The GEMM -> RS that runs where none is chosen.")
      .field("method", &comm::GemmRsDefault::method, "the method")
      .field("pull_shards", &comm::GemmRsDefault::pull_shards, "the ring's pull_shards")
      .done();
  ConfigClass<comm::BulkRsConfig>(c, "BulkRsConfig",
                                  "Tuning of reduce_scatter_beside_gemm (overlap_ops.h).")
      .field("reduce_max_blocks", &comm::BulkRsConfig::reduce_max_blocks, "reduction grid bound")
      .field("gemm_sm_margin", &comm::BulkRsConfig::gemm_sm_margin, "SMs the GEMM leaves free")
      .field("pieces", &comm::BulkRsConfig::pieces, "pieces of the partial sums")
      .done();
  constexpr const char* kSizeDoc = " at `size` ranks (<= 0: any size); NOTE [overlap defaults].";
  c.def("ag_gemm_defaults", &comm::ag_gemm_defaults, py::arg("size"),
        (std::string("ag_gemm's defaults") + kSizeDoc).c_str());
  c.def("gemm_rs_defaults", &comm::gemm_rs_defaults, py::arg("size"),
        (std::string("gemm_rs's defaults") + kSizeDoc).c_str());
  c.def("gemm_rs_ring_defaults", &comm::gemm_rs_ring_defaults, py::arg("size"),
        (std::string("gemm_rs_ring's defaults") + kSizeDoc).c_str());
  c.def("gemm_rs_default", &comm::gemm_rs_default, py::arg("size"),
        (std::string("The GEMM -> RS that runs where none is chosen") + kSizeDoc).c_str());
  c.def("bulk_rs_defaults", &comm::bulk_rs_defaults, py::arg("size"),
        (std::string("reduce_scatter_beside_gemm's defaults") + kSizeDoc).c_str());
}

// `value`, or the default when it is None.
template <typename T>
T or_default(const std::optional<T>& value, T fallback) {
  return value.has_value() ? *value : fallback;
}

}  // namespace

void register_comm_ops(py::module_& m) {
  py::module_ c = m.def_submodule("comm_ops", "Comm-GEMM overlap ops (use overlap.ops).");
  register_tuning(c);
  // The one per-tensor scale slot of a gathered FP8 shard (NOTE [ag_gemm layout]): the
  // buffer managers' layout (overlap/buffers/layout.py) takes it from here.
  c.attr("SCALE_SLOT_BYTES") = comm::kScaleSlotBytes;
  c.def(
      "ag_gemm_layout",
      [](int size, std::size_t shard_bytes, bool scaled) {
        const comm::AgGemmLayout l = comm::ag_gemm_layout(size, shard_bytes, scaled);
        return py::make_tuple(l.scale_offset, l.bytes);
      },
      py::arg("size"), py::arg("shard_bytes"), py::arg("scaled"),
      "(scale_offset, bytes) of NOTE [ag_gemm layout].");
  c.def(
      "gemm_rs_layout",
      [](int size, std::size_t partial_bytes) {
        const comm::GemmRsLayout l = comm::gemm_rs_layout(size, partial_bytes);
        return py::make_tuple(l.slot_bytes, l.recv_offset, l.bytes);
      },
      py::arg("size"), py::arg("partial_bytes"),
      "(slot_bytes, recv_offset, bytes) of NOTE [gemm_rs layout].");
  c.def(
      "gemm_rs_ring_layout",
      [](int size, std::size_t partial_bytes) {
        const comm::GemmRsLayout l = comm::gemm_rs_ring_layout(size, partial_bytes);
        return py::make_tuple(l.slot_bytes, l.recv_offset, l.bytes);
      },
      py::arg("size"), py::arg("partial_bytes"),
      "(slot_bytes, recv_offset, bytes) of NOTE [gemm_rs_ring layout].");
  c.def(
      "ag_gemm",
      [](SymmetricBuffer& buf, py::handle a, const py::sequence& b, const py::sequence& out,
         bool transb, py::handle a_scale_inv, const py::sequence& b_scale_inv,
         const py::sequence& bias, bool gelu, float alpha, bool fast_accum, int sm_count,
         int compute_lanes, bool staggered_puts, int pieces, bool pull_shards, bool keep_gathered,
         bool fused_gemm, std::uintptr_t stream) {
        constexpr const char* kOp = "ag_gemm";
        const std::size_t num = py::len(b);
        OVERLAP_CHECK_ARG(
            num >= 1 && py::len(out) == num && py::len(b_scale_inv) == num && py::len(bias) == num,
            kOp << ": b, out, b_scale_inv and bias take one entry per weight (got " << num << ", "
                << py::len(out) << ", " << py::len(b_scale_inv) << ", " << py::len(bias) << ")");
        const TensorRef ar = tensor_ref_from_py(a, "input");
        const gemm::GemmOperand ao =
            operand(buf, ar, optional_tensor_ref_from_py(a_scale_inv, "input scale_inv"), false,
                    kOp, "input");
        std::vector<comm::AgGemmWeight> weights(num);
        for (std::size_t i = 0; i < num; ++i) {
          comm::AgGemmWeight& w = weights[i];
          const TensorRef br = tensor_ref_from_py(b[i], "weight");
          w.b = operand(buf, br, optional_tensor_ref_from_py(b_scale_inv[i], "weight scale_inv"),
                        transb, kOp, "weight");
          w.d = output(buf, tensor_ref_from_py(out[i], "output"), kOp);
          w.options.alpha = alpha;
          w.options.gelu = gelu;
          w.options.fast_accum = fast_accum;
          w.options.sm_count = sm_count;
          if (const auto biasr = optional_tensor_ref_from_py(bias[i], "bias")) {
            OVERLAP_CHECK_ARG(biasr->is_contiguous() && biasr->numel() == w.d.cols,
                              kOp << ": bias must be contiguous with " << w.d.cols
                                  << " elements, got " << biasr->describe());
            buf.check_tensor(*biasr, "bias");
            w.options.bias = biasr->data;
            w.options.bias_dtype = biasr->dtype;
          }
        }
        comm::AgGemmConfig c;
        c.compute_lanes = compute_lanes;
        c.staggered_puts = staggered_puts;
        c.pull_shards = pull_shards;
        c.pieces = pieces;
        c.keep_gathered = keep_gathered;
        c.fused_gemm = fused_gemm;
        py::gil_scoped_release release;
        comm::run_op(buf, [&] { comm::ag_gemm(buf, ao, weights, c, stream_from_py(stream)); });
      },
      py::arg("buffer"), py::arg("a"), py::arg("b"), py::arg("out"), py::kw_only(),
      py::arg("transb"), py::arg("a_scale_inv") = py::none(), py::arg("b_scale_inv"),
      py::arg("bias"), py::arg("gelu") = false, py::arg("alpha") = 1.0f,
      py::arg("fast_accum") = false, py::arg("sm_count") = 0,
      py::arg("compute_lanes") = comm::AgGemmConfig{}.compute_lanes,
      py::arg("staggered_puts") = comm::AgGemmConfig{}.staggered_puts,
      py::arg("pieces") = comm::AgGemmConfig{}.pieces,
      py::arg("pull_shards") = comm::AgGemmConfig{}.pull_shards,
      py::arg("keep_gathered") = comm::AgGemmConfig{}.keep_gathered,
      py::arg("fused_gemm") = comm::AgGemmConfig{}.fused_gemm, py::arg("stream") = 0,
      "out[w] = AllGather(a) @ op(b[w]) for every weight w, one gather (b, out, b_scale_inv, "
      "bias: lists of one entry per weight); see csrc/comm/overlap/overlap_ops.h.");
  c.def(
      "gemm_rs",
      [](SymmetricBuffer& buf, py::handle a, py::handle b, py::handle out, bool transb,
         py::handle a_scale_inv, py::handle b_scale_inv, py::handle out_scale, py::handle out_amax,
         py::handle out_scale_inv, float alpha, bool fast_accum, int sm_count,
         comm::RsMethod method, std::optional<int> compute_lanes,
         std::optional<int> reduce_max_blocks, std::optional<int> ring_subchunks,
         std::optional<int> pieces, std::optional<bool> pull_shards, std::uintptr_t stream) {
        constexpr const char* kOp = "gemm_rs";
        const bool ring = method == comm::RsMethod::kRing;
        OVERLAP_CHECK(ring || (!ring_subchunks && !pull_shards), kConfig,
                      kOp << ": ring_subchunks and pull_shards are the ring method's (the "
                             "pipelined method always pulls)");
        OVERLAP_CHECK(!ring || !pieces, kConfig,
                      kOp << ": pieces are the pipelined method's; the ring pipelines its hops "
                             "with ring_subchunks");
        const auto [ao, bo] = operands(buf, a, a_scale_inv, b, b_scale_inv, transb, kOp);
        const TensorRef outr = tensor_ref_from_py(out, "output");
        gemm::GemmOutput d = output(buf, outr, kOp);
        d.scale =
            scalar(buf, optional_tensor_ref_from_py(out_scale, "out_scale"), kOp, "out_scale");
        d.amax = scalar(buf, optional_tensor_ref_from_py(out_amax, "out_amax"), kOp, "out_amax");
        float* const scale_inv = scalar(
            buf, optional_tensor_ref_from_py(out_scale_inv, "out_scale_inv"), kOp, "out_scale_inv");
        gemm::GemmOptions o;
        o.alpha = alpha;
        o.fast_accum = fast_accum;
        o.sm_count = sm_count;
        const cudaStream_t s = stream_from_py(stream);
        if (ring) {
          const comm::GemmRsRingConfig d0;
          comm::GemmRsRingConfig c;
          c.compute_lanes = or_default(compute_lanes, d0.compute_lanes);
          c.reduce_max_blocks = or_default(reduce_max_blocks, d0.reduce_max_blocks);
          c.ring_subchunks = or_default(ring_subchunks, d0.ring_subchunks);
          c.pull_shards = or_default(pull_shards, d0.pull_shards);
          py::gil_scoped_release release;
          comm::run_op(buf, [&] { comm::gemm_rs_ring(buf, ao, bo, d, scale_inv, o, c, s); });
        } else {
          const comm::GemmRsConfig d0;
          comm::GemmRsConfig c;
          c.compute_lanes = or_default(compute_lanes, d0.compute_lanes);
          c.reduce_max_blocks = or_default(reduce_max_blocks, d0.reduce_max_blocks);
          c.pieces = or_default(pieces, d0.pieces);
          py::gil_scoped_release release;
          comm::run_op(buf, [&] { comm::gemm_rs(buf, ao, bo, d, scale_inv, o, c, s); });
        }
      },
      py::arg("buffer"), py::arg("a"), py::arg("b"), py::arg("out"), py::kw_only(),
      py::arg("transb"), py::arg("a_scale_inv") = py::none(), py::arg("b_scale_inv") = py::none(),
      py::arg("out_scale") = py::none(), py::arg("out_amax") = py::none(),
      py::arg("out_scale_inv") = py::none(), py::arg("alpha") = 1.0f, py::arg("fast_accum") = false,
      py::arg("sm_count") = 0, py::arg("method") = comm::GemmRsDefault{}.method,
      py::arg("compute_lanes") = py::none(), py::arg("reduce_max_blocks") = py::none(),
      py::arg("ring_subchunks") = py::none(), py::arg("pieces") = py::none(),
      py::arg("pull_shards") = py::none(), py::arg("stream") = 0,
      "out = ReduceScatter(a @ op(b)), pipelined (in pieces) or ring (RsMethod); a tuning knob "
      "left None takes the method's default (GemmRsConfig, GemmRsRingConfig), one of the other "
      "method is refused; see csrc/comm/overlap/overlap_ops.h.");
}

// ---- bulk overlap ops (comm/overlap/bulk.cpp) ------------------------------------------------

namespace {

// The side GEMM of a bulk op from a dict (overlap/ops/bulk.py builds it): a, b, out (tensors),
// optional a_scale_inv, b_scale_inv, bias, out_scale, out_amax (tensors), transa, transb,
// gelu, fast_accum (bool), alpha, beta (float), sm_count (int). The gemm() rules apply
// (gemm/gemm.h); FP8 operands are per-tensor scaled.
comm::SideGemm side_gemm(const SymmetricBuffer& buf, const py::dict& x, const char* op) {
  // One pass over the dict, each key matched by identity against the names interned once
  // (Python interns the literal keys overlap/ops/_side_gemm.py writes), by value otherwise: no
  // Python string is made per key and call on the host's launch path of every bulk op (NOTE
  // [tensor conversion cost] in tensor_arg.cpp).
  enum Key {
    kA,
    kB,
    kOut,
    kAScaleInv,
    kBScaleInv,
    kBias,
    kOutScale,
    kOutAmax,
    kTransa,
    kTransb,
    kGelu,
    kFastAccum,
    kAlpha,
    kBeta,
    kSmCount,
    kNumKeys
  };
  static const char* const kKeys[kNumKeys] = {
      "a",      "b",      "out",  "a_scale_inv", "b_scale_inv", "bias", "out_scale", "out_amax",
      "transa", "transb", "gelu", "fast_accum",  "alpha",       "beta", "sm_count"};
  static PyObject* const* const kInterned = [] {
    static PyObject* names[kNumKeys];
    for (int i = 0; i < kNumKeys; ++i) {
      names[i] = PyUnicode_InternFromString(kKeys[i]);  // never released (as intern())
      if (names[i] == nullptr) throw py::error_already_set();
    }
    return names;
  }();
  py::handle value[kNumKeys];  // borrowed from the dict, which the caller holds
  PyObject* key = nullptr;
  PyObject* item = nullptr;
  Py_ssize_t pos = 0;
  while (PyDict_Next(x.ptr(), &pos, &key, &item)) {
    int i = 0;
    while (i < kNumKeys && key != kInterned[i]) ++i;
    if (i == kNumKeys && PyUnicode_Check(key)) {
      i = 0;
      while (i < kNumKeys && PyUnicode_CompareWithASCIIString(key, kKeys[i]) != 0) ++i;
    }
    OVERLAP_CHECK_ARG(i < kNumKeys,
                      op << ": unknown GEMM argument '" << py::str(key).cast<std::string>() << "'");
    value[i] = item;
  }
  const auto get = [&value](Key k) {
    return value[k] ? py::reinterpret_borrow<py::object>(value[k]) : py::object(py::none());
  };
  const auto flag = [&get](Key k) {
    const py::object v = get(k);
    return !v.is_none() && v.cast<bool>();
  };
  const auto number = [&get](Key k, double fallback) {
    const py::object v = get(k);
    return v.is_none() ? fallback : v.cast<double>();
  };
  comm::SideGemm g;
  g.a = operand(buf, tensor_ref_from_py(get(kA), "the GEMM's a"),
                optional_tensor_ref_from_py(get(kAScaleInv), "a_scale_inv"), flag(kTransa), op,
                "the GEMM's a");
  g.b = operand(buf, tensor_ref_from_py(get(kB), "the GEMM's b"),
                optional_tensor_ref_from_py(get(kBScaleInv), "b_scale_inv"), flag(kTransb), op,
                "the GEMM's b");
  g.d = output(buf, tensor_ref_from_py(get(kOut), "the GEMM's out"), op);
  g.d.scale = scalar(buf, optional_tensor_ref_from_py(get(kOutScale), "the GEMM's out_scale"), op,
                     "the GEMM's out_scale");
  g.d.amax = scalar(buf, optional_tensor_ref_from_py(get(kOutAmax), "the GEMM's out_amax"), op,
                    "the GEMM's out_amax");
  g.options.alpha = static_cast<float>(number(kAlpha, 1.0));
  g.options.beta = static_cast<float>(number(kBeta, 0.0));
  g.options.gelu = flag(kGelu);
  g.options.fast_accum = flag(kFastAccum);
  g.options.sm_count = static_cast<int>(number(kSmCount, 0));
  if (const auto biasr = optional_tensor_ref_from_py(get(kBias), "bias")) {
    const std::int64_t n = g.b.transposed ? g.b.rows : g.b.cols;
    OVERLAP_CHECK_ARG(
        biasr->is_contiguous() && biasr->numel() == n,
        op << ": bias must be contiguous with " << n << " elements, got " << biasr->describe());
    buf.check_tensor(*biasr, "bias");
    g.options.bias = biasr->data;
    g.options.bias_dtype = biasr->dtype;
  }
  return g;
}

// A 2-D tensor, contiguous and where the buffer's transport works.
TensorRef matrix(const SymmetricBuffer& buf, py::handle t, const char* op, const char* what) {
  const TensorRef r = tensor_ref_from_py(t, what);
  OVERLAP_CHECK_ARG(r.shape.size() == 2,
                    op << ": " << what << " must be 2-D, got " << r.describe());
  buf.check_tensor(r, what);
  return r;
}

}  // namespace

void register_comm_bulk_ops(py::module_& m) {
  py::module_ c = m.attr("comm_ops").cast<py::module_>();
  c.def(
      "bulk_rs_layout",
      [](int size, std::size_t partial_bytes) {
        const comm::BulkRsLayout l = comm::bulk_rs_layout(size, partial_bytes);
        return py::make_tuple(l.slot_bytes, l.bytes);
      },
      py::arg("size"), py::arg("partial_bytes"), "(slot_bytes, bytes) of NOTE [bulk_rs layout].");
  c.def(
      "all_gather_beside_gemm",
      [](SymmetricBuffer& buf, py::handle shard, const py::dict& gemm, py::handle shard_scale_inv,
         std::uintptr_t stream) {
        constexpr const char* kOp = "bulk_all_gather";
        const TensorRef sr = tensor_ref_from_py(shard, "shard");
        buf.check_tensor(sr, "the shard");
        comm::GatherShard s;
        s.data = sr.data;
        s.bytes = static_cast<std::size_t>(sr.numel()) * dtype_size(sr.dtype);
        s.scale_inv = scalar(buf, optional_tensor_ref_from_py(shard_scale_inv, "shard_scale_inv"),
                             kOp, "shard_scale_inv");
        OVERLAP_CHECK_ARG(dtype_is_fp8(sr.dtype) == (s.scale_inv != nullptr),
                          kOp << ": an FP8 shard needs its scale_inv, other shards take none");
        const comm::SideGemm g = side_gemm(buf, gemm, kOp);
        py::gil_scoped_release release;
        comm::run_op(buf, [&] { comm::all_gather_beside_gemm(buf, s, g, stream_from_py(stream)); });
      },
      py::arg("buffer"), py::arg("shard"), py::arg("gemm"), py::kw_only(),
      py::arg("shard_scale_inv") = py::none(), py::arg("stream") = 0,
      "Gather `shard` into the buffer while the GEMM described by `gemm` runs; see "
      "csrc/comm/overlap/overlap_ops.h.");
  c.def(
      "reduce_scatter_beside_gemm",
      [](SymmetricBuffer& buf, py::handle input, py::handle out, const py::dict& gemm,
         py::handle out_scale, py::handle out_scale_inv, py::handle out_amax, int reduce_max_blocks,
         int gemm_sm_margin, int pieces, std::uintptr_t stream) {
        constexpr const char* kOp = "bulk_reduce_scatter";
        const TensorRef ir = matrix(buf, input, kOp, "the input");
        const TensorRef orf = matrix(buf, out, kOp, "the output");
        const comm::ScatterInput in{ir.data, ir.dtype, ir.shape[0], ir.shape[1]};
        comm::ScatterOutput o;
        o.data = orf.data;
        o.dtype = orf.dtype;
        o.rows = orf.shape[0];
        o.cols = orf.shape[1];
        o.scale =
            scalar(buf, optional_tensor_ref_from_py(out_scale, "out_scale"), kOp, "out_scale");
        o.scale_inv = scalar(buf, optional_tensor_ref_from_py(out_scale_inv, "out_scale_inv"), kOp,
                             "out_scale_inv");
        o.amax = scalar(buf, optional_tensor_ref_from_py(out_amax, "out_amax"), kOp, "out_amax");
        const comm::SideGemm g = side_gemm(buf, gemm, kOp);
        comm::BulkRsConfig config;
        config.reduce_max_blocks = reduce_max_blocks;
        config.gemm_sm_margin = gemm_sm_margin;
        config.pieces = pieces;
        py::gil_scoped_release release;
        comm::run_op(buf, [&] {
          comm::reduce_scatter_beside_gemm(buf, in, o, g, config, stream_from_py(stream));
        });
      },
      py::arg("buffer"), py::arg("input"), py::arg("out"), py::arg("gemm"), py::kw_only(),
      py::arg("out_scale") = py::none(), py::arg("out_scale_inv") = py::none(),
      py::arg("out_amax") = py::none(),
      py::arg("reduce_max_blocks") = comm::BulkRsConfig{}.reduce_max_blocks,
      py::arg("gemm_sm_margin") = comm::BulkRsConfig{}.gemm_sm_margin,
      py::arg("pieces") = comm::BulkRsConfig{}.pieces, py::arg("stream") = 0,
      "out = this rank's rows of ReduceScatter(input) while the GEMM described by `gemm` runs; "
      "see csrc/comm/overlap/overlap_ops.h.");
}

}  // namespace overlap::bindings
