// The repeated call's lookup and checks in C++ (gemm_ladder.serve.native builds and loads it).
//
// front._fast looks a call up by its operands' shapes, strides, dtypes and devices, then checks
// again what may differ between calls with the same key (grad, alignment, overlap). In Python that
// key alone costs 1.4-2.3 us a call on the H100 box's host, which is the gap to F.linear wherever
// torch's kernel is the measured choice (a 15-30 us call). Here the same key and checks read the
// tensors' C++ fields, and torch's route calls aten::linear.out without Python's argument parser.
//
// The table: key -> entry. Python registers an entry after a fully checked call (front._remember),
// with the tensors of that call (the key is made here, the one encoding for both sides).
//   kind 0 (torch's route): aten::linear(.out) into out; route.calls counted here.
//   kind 1 (a kernel of ours): the Python callable `call(A, B, out, bias)`, after the checks.
// split_tail(A, B, D_main, tail, D): the rest of a split N's call (front.PaddedLaunch._split) after
// our kernel wrote D's first columns into D_main: torch's product of B's last rows into tail, then
// both into D, two ATen calls without Python's argument parsing in between.
// scaled_lookup(A, B, scale_a, scale_b, bias, out, out_dtype, strict): the fp8 front door's repeated
// call (scaled._repeat): the same key over its six tensors and the two arguments as passed, then the
// views its launch takes (B as [N, K], the scales as vectors or, block's, transposed as they lie)
// and D made here, and the Python launch called with them.
// lookup(A, B, out, bias) returns D, or None when the call must take the checked path: no entry,
// an operand that is not a plain torch.Tensor / nn.Parameter (subclasses have their own
// __torch_function__), a torch function or dispatch mode active (fake tensors, tracing), grad
// wanted, a misaligned pointer (kernels only), or out overlapping A, B or the bias.
//
// Hand-written, not pybind11 or torch.utils.cpp_extension: METH_FASTCALL entry points and no
// build-system dependency (ninja), so it builds with the compiler alone (native.py) in seconds.

#include <Python.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/mm.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

namespace {

struct Entry {
  int kind = 0;               // 0: torch's route, 1: a Python launch
  PyObject* route = nullptr;  // the Route (its `calls` counted for kind 0)
  PyObject* call = nullptr;   // kind 1: call(A, B, out, bias)
  int64_t a_bytes = 0, b_bytes = 0, d_bytes = 0;
};

std::unordered_map<std::string, Entry> table;
PyTypeObject* tensor_type = nullptr;
PyTypeObject* param_type = nullptr;
PyObject* calls_name = nullptr;
PyObject* one = nullptr;

// Appends o's part of the key; nullptr in *t for None. False: not a plain strided tensor.
bool add_key(std::string& key, PyObject* o, const at::Tensor** t) {
  if (o == Py_None) {
    key.push_back('\0');
    *t = nullptr;
    return true;
  }
  PyTypeObject* type = Py_TYPE(o);
  if (type != tensor_type && type != param_type) return false;
  const at::Tensor& x = THPVariable_Unpack(o);
  if (x.layout() != c10::kStrided || x.is_nested() || !x.has_storage()) return false;
  const int64_t dim = x.dim();
  key.push_back(static_cast<char>(dim + 1));
  key.append(reinterpret_cast<const char*>(x.sizes().data()), dim * sizeof(int64_t));
  key.append(reinterpret_cast<const char*>(x.strides().data()), dim * sizeof(int64_t));
  const c10::Device dev = x.device();
  key.push_back(static_cast<char>(x.scalar_type()));
  key.push_back(static_cast<char>(dev.type()));
  key.push_back(static_cast<char>(dev.index()));
  *t = &x;
  return true;
}

bool make_key(PyObject* const* args, std::string& key, const at::Tensor** ts) {
  key.reserve(160);
  for (int i = 0; i < 4; ++i)
    if (!add_key(key, args[i], &ts[i])) return false;
  return ts[0] != nullptr && ts[1] != nullptr;
}

bool modes_active() {
  return at::impl::torch_function_mode_enabled() || c10::impl::TorchDispatchModeTLS::stack_len() > 0;
}

uintptr_t ptr(const at::Tensor* t) { return reinterpret_cast<uintptr_t>(t->data_ptr()); }

// front._fast's checks of what the key does not fix.
bool passes(const Entry& e, const at::Tensor* const* ts) {
  const at::Tensor *A = ts[0], *B = ts[1], *D = ts[2], *bias = ts[3];
  bool wants_grad = A->requires_grad() || B->requires_grad() || (D && D->requires_grad()) ||
                    (bias && bias->requires_grad());
  if (wants_grad && c10::GradMode::is_enabled()) return false;
  const uintptr_t pa = ptr(A), pb = ptr(B);
  const bool kernel = e.kind == 1;
  uintptr_t pc = 0;
  if (bias) {
    pc = ptr(bias);
    if (kernel && (pc & 15)) return false;  // the checked path copies it onto a 16-byte boundary
  }
  if (!D) return !(kernel && ((pa | pb) & 15));
  const uintptr_t pd = ptr(D);
  if (kernel && ((pa | pb | pd) & 15)) return false;
  const uintptr_t d_end = pd + e.d_bytes;
  if ((pd < pa + e.a_bytes && pa < d_end) || (pd < pb + e.b_bytes && pb < d_end)) return false;
  if (bias && pd < pc + static_cast<uintptr_t>(bias->nbytes()) && pc < d_end) return false;
  return true;
}

bool count_call(PyObject* route) {
  PyObject* n = PyObject_GetAttr(route, calls_name);
  if (!n) return false;
  PyObject* n1 = PyNumber_Add(n, one);
  Py_DECREF(n);
  if (!n1) return false;
  int rc = PyObject_SetAttr(route, calls_name, n1);
  Py_DECREF(n1);
  return rc == 0;
}

PyObject* lookup(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "lookup(A, B, out, bias) takes 4 arguments");
    return nullptr;
  }
  if (modes_active()) Py_RETURN_NONE;
  std::string key;
  const at::Tensor* ts[4];
  if (!make_key(args, key, ts)) Py_RETURN_NONE;
  auto it = table.find(key);
  if (it == table.end()) Py_RETURN_NONE;
  const Entry& e = it->second;
  if (!passes(e, ts)) Py_RETURN_NONE;
  if (e.kind == 1 || (ts[2] && ts[0]->dim() != 2)) return PyObject_Vectorcall(e.call, args, 4, nullptr);
  if (!count_call(e.route)) return nullptr;
  std::optional<at::Tensor> bias;
  if (ts[3]) bias = *ts[3];
  if (ts[2]) {
    {
      pybind11::gil_scoped_release no_gil;
      at::linear_out(const_cast<at::Tensor&>(*ts[2]), *ts[0], *ts[1], bias);
    }
    Py_INCREF(args[2]);
    return args[2];
  }
  at::Tensor d;
  {
    pybind11::gil_scoped_release no_gil;
    d = at::linear(*ts[0], *ts[1], bias);
  }
  return THPVariable_Wrap(std::move(d));
  END_HANDLE_TH_ERRORS
}

// split_tail(A, B, D_main, tail, D): tail = A . B[Nk:]^T, then D = [D_main | tail] (Nk: D_main's
// columns). The caller (front.PaddedLaunch._split) made every tensor and checked them: A [M, K],
// B [N, K], D_main [M, Nk], tail [M, N - Nk] and D [M, N], one GPU and dtype.
PyObject* split_tail(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 5) {
    PyErr_SetString(PyExc_TypeError, "split_tail(A, B, D_main, tail, D) takes 5 arguments");
    return nullptr;
  }
  for (int i = 0; i < 5; ++i) {
    if (!THPVariable_Check(args[i])) {
      PyErr_SetString(PyExc_TypeError, "split_tail(A, B, D_main, tail, D) takes tensors");
      return nullptr;
    }
  }
  const at::Tensor& a = THPVariable_Unpack(args[0]);
  const at::Tensor& b = THPVariable_Unpack(args[1]);
  const at::Tensor& d_main = THPVariable_Unpack(args[2]);
  at::Tensor tail = THPVariable_Unpack(args[3]);
  at::Tensor d = THPVariable_Unpack(args[4]);
  if (a.dim() != 2 || b.dim() != 2 || d_main.dim() != 2 || tail.dim() != 2 || d.dim() != 2 ||
      d_main.size(1) + tail.size(1) != d.size(1) || b.size(0) != d.size(1)) {
    PyErr_SetString(PyExc_ValueError, "split_tail: A [M, K], B [N, K], D_main [M, Nk], tail [M, N - Nk], D [M, N]");
    return nullptr;
  }
  const int64_t nk = d_main.size(1);
  {
    pybind11::gil_scoped_release no_gil;
    at::mm_out(tail, a, b.narrow(0, nk, b.size(0) - nk).t());
    at::cat_out(d, {d_main, tail}, 1);
  }
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

void drop(Entry& e) {
  Py_XDECREF(e.route);
  Py_XDECREF(e.call);
}

// remember(A, B, out, bias, kind, route, call, a_bytes, b_bytes, d_bytes): True when kept.
PyObject* remember(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 10) {
    PyErr_SetString(PyExc_TypeError,
                    "remember(A, B, out, bias, kind, route, call, a_bytes, b_bytes, d_bytes) takes 10 arguments");
    return nullptr;
  }
  std::string key;
  const at::Tensor* ts[4];
  if (!make_key(args, key, ts)) Py_RETURN_FALSE;
  Entry e;
  e.kind = static_cast<int>(PyLong_AsLong(args[4]));
  e.a_bytes = PyLong_AsLongLong(args[7]);
  e.b_bytes = PyLong_AsLongLong(args[8]);
  e.d_bytes = PyLong_AsLongLong(args[9]);
  if (PyErr_Occurred()) return nullptr;
  if (e.kind != 0 && e.kind != 1) {
    PyErr_SetString(PyExc_ValueError, "kind is 0 (torch's route) or 1 (a Python launch)");
    return nullptr;
  }
  if (!PyCallable_Check(args[6])) {
    PyErr_SetString(PyExc_TypeError, "call must be callable (it runs kind 1, and kind 0 with batch dims and out)");
    return nullptr;
  }
  e.route = args[5];
  e.call = args[6];
  Py_INCREF(e.route);
  Py_INCREF(e.call);
  auto found = table.find(key);
  if (found != table.end()) {
    drop(found->second);
    found->second = e;
  } else {
    table.emplace(std::move(key), e);
  }
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

// -- scaled_mm's repeated call -----------------------------------------------------------------------
struct ScaledEntry {
  PyObject* launch = nullptr;  // launch(A, B_nk, D, [bias,] scale_a, scale_b): the route's bound launch
  int64_t M = 0, N = 0;
  at::ScalarType d_dtype = at::kBFloat16;
  bool block = false;  // the scales passed transposed, as they lie (else as vectors)
  int64_t a_bytes = 0, b_bytes = 0, d_bytes = 0;
};

std::unordered_map<std::string, ScaledEntry> scaled_table;

// out_dtype (None or a torch.dtype) and strict (None, True or False) as passed; false: neither.
bool add_flags(std::string& key, PyObject* out_dtype, PyObject* strict) {
  if (out_dtype == Py_None) {
    key.push_back('\xff');
  } else if (THPDtype_Check(out_dtype)) {
    key.push_back(static_cast<char>(reinterpret_cast<THPDtype*>(out_dtype)->scalar_type));
  } else {
    return false;
  }
  if (strict == Py_None) {
    key.push_back('n');
  } else if (strict == Py_True) {
    key.push_back('t');
  } else if (strict == Py_False) {
    key.push_back('f');
  } else {
    return false;
  }
  return true;
}

// args: A, B, scale_a, scale_b, bias, out, out_dtype, strict (the first eight of both entry points).
bool make_scaled_key(PyObject* const* args, std::string& key, const at::Tensor** ts) {
  key.reserve(256);
  for (int i = 0; i < 6; ++i)
    if (!add_key(key, args[i], &ts[i])) return false;
  return ts[0] && ts[1] && ts[2] && ts[3] && add_flags(key, args[6], args[7]);
}

bool overlap(uintptr_t p, int64_t n, uintptr_t q, int64_t m) {
  return p < q + static_cast<uintptr_t>(m) && q < p + static_cast<uintptr_t>(n);
}

// scaled._run_repeat's checks: no grad wanted, block scales 16-byte aligned, out apart from what the
// kernel reads (sa and sb: the scales as the launch takes them).
bool scaled_passes(const ScaledEntry& e, const at::Tensor* const* ts, const at::Tensor& sa, const at::Tensor& sb) {
  bool wants_grad = false;
  for (int i = 0; i < 6; ++i)
    if (ts[i] && ts[i]->requires_grad()) wants_grad = true;
  if (wants_grad && c10::GradMode::is_enabled()) return false;
  if (e.block && ((ptr(&sa) | ptr(&sb)) & 15)) return false;
  const at::Tensor *bias = ts[4], *D = ts[5];
  if (!D) return true;
  const uintptr_t pd = ptr(D);
  return !(overlap(pd, e.d_bytes, ptr(ts[0]), e.a_bytes) || overlap(pd, e.d_bytes, ptr(ts[1]), e.b_bytes) ||
           overlap(pd, e.d_bytes, ptr(&sa), sa.nbytes()) || overlap(pd, e.d_bytes, ptr(&sb), sb.nbytes()) ||
           (bias && overlap(pd, e.d_bytes, ptr(bias), bias->nbytes())));
}

// A scale as the launch takes it: block's transposed, else a vector (a view: [], [1, 1] -> [1]).
at::Tensor scale_view(const at::Tensor& s, bool block) {
  if (block) return s.t();
  return s.dim() == 1 ? s : s.reshape({-1});
}

// The Python object of view v of the argument o (o itself where v is o's tensor): a new reference.
PyObject* wrap_view(PyObject* o, const at::Tensor& of, const at::Tensor& v) {
  if (v.unsafeGetTensorImpl() == of.unsafeGetTensorImpl()) {
    Py_INCREF(o);
    return o;
  }
  return THPVariable_Wrap(v);
}

PyObject* scaled_lookup(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 8) {
    PyErr_SetString(PyExc_TypeError, "scaled_lookup(A, B, scale_a, scale_b, bias, out, out_dtype, strict) takes 8 "
                                     "arguments");
    return nullptr;
  }
  if (modes_active()) Py_RETURN_NONE;
  std::string key;
  const at::Tensor* ts[6];
  if (!make_scaled_key(args, key, ts)) Py_RETURN_NONE;
  auto it = scaled_table.find(key);
  if (it == scaled_table.end()) Py_RETURN_NONE;
  const ScaledEntry& e = it->second;
  const at::Tensor sa = scale_view(*ts[2], e.block), sb = scale_view(*ts[3], e.block);
  if (!scaled_passes(e, ts, sa, sb)) Py_RETURN_NONE;
  PyObject* d = args[5];
  if (ts[5]) {
    Py_INCREF(d);
  } else {
    d = THPVariable_Wrap(at::empty({e.M, e.N}, ts[0]->options().dtype(e.d_dtype)));
    if (!d) return nullptr;
  }
  PyObject* b_nk = THPVariable_Wrap(ts[1]->t());
  PyObject* sa_obj = wrap_view(args[2], *ts[2], sa);
  PyObject* sb_obj = wrap_view(args[3], *ts[3], sb);
  PyObject* result = nullptr;
  if (b_nk && sa_obj && sb_obj) {
    PyObject* call[6] = {args[0], b_nk, d};
    Py_ssize_t n = 3;
    if (ts[4]) call[n++] = args[4];
    call[n++] = sa_obj;
    call[n++] = sb_obj;
    result = PyObject_Vectorcall(e.launch, call, n, nullptr);
  }
  Py_XDECREF(b_nk);
  Py_XDECREF(sa_obj);
  Py_XDECREF(sb_obj);
  if (!result) {
    Py_DECREF(d);
    return nullptr;
  }
  Py_DECREF(result);
  return d;
  END_HANDLE_TH_ERRORS
}

// scaled_remember(A, B, scale_a, scale_b, bias, out, out_dtype, strict, launch, M, N, d_dtype, block,
// a_bytes, b_bytes, d_bytes): True when kept.
PyObject* scaled_remember(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 16) {
    PyErr_SetString(PyExc_TypeError, "scaled_remember(A, B, scale_a, scale_b, bias, out, out_dtype, strict, launch, "
                                     "M, N, d_dtype, block, a_bytes, b_bytes, d_bytes) takes 16 arguments");
    return nullptr;
  }
  std::string key;
  const at::Tensor* ts[6];
  if (!make_scaled_key(args, key, ts)) Py_RETURN_FALSE;
  if (!PyCallable_Check(args[8])) {
    PyErr_SetString(PyExc_TypeError, "launch must be callable: launch(A, B_nk, D, [bias,] scale_a, scale_b)");
    return nullptr;
  }
  if (!THPDtype_Check(args[11])) {
    PyErr_SetString(PyExc_TypeError, "d_dtype must be a torch.dtype");
    return nullptr;
  }
  ScaledEntry e;
  e.M = PyLong_AsLongLong(args[9]);
  e.N = PyLong_AsLongLong(args[10]);
  e.d_dtype = reinterpret_cast<THPDtype*>(args[11])->scalar_type;
  const int block = PyObject_IsTrue(args[12]);
  e.a_bytes = PyLong_AsLongLong(args[13]);
  e.b_bytes = PyLong_AsLongLong(args[14]);
  e.d_bytes = PyLong_AsLongLong(args[15]);
  if (block < 0 || PyErr_Occurred()) return nullptr;
  if (e.M < 1 || e.N < 1) {
    PyErr_SetString(PyExc_ValueError, "M and N must be at least 1 (an empty D launches nothing)");
    return nullptr;
  }
  e.block = block != 0;
  e.launch = args[8];
  Py_INCREF(e.launch);
  auto found = scaled_table.find(key);
  if (found != scaled_table.end()) {
    Py_XDECREF(found->second.launch);
    found->second = e;
  } else {
    scaled_table.emplace(std::move(key), e);
  }
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

PyObject* scaled_clear(PyObject*, PyObject*) {
  for (auto& kv : scaled_table) Py_XDECREF(kv.second.launch);
  scaled_table.clear();
  Py_RETURN_NONE;
}

PyObject* scaled_size(PyObject*, PyObject*) { return PyLong_FromSize_t(scaled_table.size()); }

PyObject* clear(PyObject*, PyObject*) {
  for (auto& kv : table) drop(kv.second);
  table.clear();
  Py_RETURN_NONE;
}

PyObject* size(PyObject*, PyObject*) { return PyLong_FromSize_t(table.size()); }

PyMethodDef methods[] = {
    {"lookup", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(lookup)), METH_FASTCALL,
     "lookup(A, B, out, bias): D for a call like a remembered one, else None"},
    {"remember", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(remember)), METH_FASTCALL,
     "remember(A, B, out, bias, kind, route, call, a_bytes, b_bytes, d_bytes)"},
    {"split_tail", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(split_tail)), METH_FASTCALL,
     "split_tail(A, B, D_main, tail, D): tail = A . B[Nk:]^T, D = [D_main | tail]"},
    {"scaled_lookup", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(scaled_lookup)), METH_FASTCALL,
     "scaled_lookup(A, B, scale_a, scale_b, bias, out, out_dtype, strict): D for an fp8 call like a remembered "
     "one, else None"},
    {"scaled_remember", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(scaled_remember)), METH_FASTCALL,
     "scaled_remember(A, B, scale_a, scale_b, bias, out, out_dtype, strict, launch, M, N, d_dtype, block, a_bytes, "
     "b_bytes, d_bytes)"},
    {"scaled_clear", scaled_clear, METH_NOARGS, "forget every fp8 entry"},
    {"scaled_size", scaled_size, METH_NOARGS, "fp8 entries remembered"},
    {"clear", clear, METH_NOARGS, "forget every entry"},
    {"size", size, METH_NOARGS, "entries remembered"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "gemm_ladder_fastpath", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_gemm_ladder_fastpath() {
  PyObject* torch = PyImport_ImportModule("torch");
  if (!torch) return nullptr;
  PyObject* tensor = PyObject_GetAttrString(torch, "Tensor");
  PyObject* nn = PyImport_ImportModule("torch.nn");
  PyObject* param = nn ? PyObject_GetAttrString(nn, "Parameter") : nullptr;
  Py_DECREF(torch);
  Py_XDECREF(nn);
  if (!tensor || !param || !PyType_Check(tensor) || !PyType_Check(param)) {
    Py_XDECREF(tensor);
    Py_XDECREF(param);
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ImportError, "torch.Tensor / torch.nn.Parameter are not types");
    return nullptr;
  }
  tensor_type = reinterpret_cast<PyTypeObject*>(tensor);  // kept for the module's life
  param_type = reinterpret_cast<PyTypeObject*>(param);
  calls_name = PyUnicode_InternFromString("calls");
  one = PyLong_FromLong(1);
  return PyModule_Create(&module_def);
}
