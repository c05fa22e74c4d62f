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
#include <ATen/ops/linear.h>
#include <ATen/ops/mm.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <pybind11/pybind11.h>
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
