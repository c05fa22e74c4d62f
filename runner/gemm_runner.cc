// gemm_runner: load an exported gemm-ladder module with the TVM runtime alone (no Python, no
// TVM compiler), run it on random inputs, check it against a CPU reference and time it.
//
//   gemm_runner build/ladder/v4_4096x4096x4096_float16_sm_90a.so [--reps 50]
//
// The shape, dtype and whether the rung is persistent come from the manifest beside the .so, and
// the epilogue's operands from its operand spec ("spec": gemm_ladder/core/spec.py; a manifest without
// one has none): a bias [N] is filled at random, passed after the launch scalars (the spec's
// order) and added to the reference, and its activation ("act") is applied to the reference after it.
// TVM's CUDA loader lives in libtvm_runtime_cuda.so, which registers itself when loaded: it is
// opened first, from the directory of libtvm_runtime.so (or $TVM_LIBRARY_DIR).
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

#define CUDA_OK(call)                                                                   \
  do {                                                                                  \
    cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_));           \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

struct Manifest {
  int64_t M = 0, N = 0, K = 0;
  std::string dtype;
  bool persistent = false;
  int cluster = 1, threads = 0, smem_bytes = 0;  // the launch: CTAs per cluster, and per CTA
  std::vector<std::string> epilogue;  // the spec's epilogue operands, in the kernel's order
  std::string act = "none";  // the spec's activation after the bias (its "act"; absent: none)
};

// The manifest is JSON written by gemm_ladder; the runner reads the shape, the dtype, whether the
// rung is persistent, and the .so's size (checked before the loader maps the file).
Manifest ReadManifest(const std::string& so_path) {
  std::ifstream in(so_path + ".json");
  if (!in) {
    std::fprintf(stderr, "%s.json is missing: export writes it beside the .so\n", so_path.c_str());
    std::exit(2);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  Manifest m;
  std::smatch g;
  if (!std::regex_search(text, g, std::regex("\"shape\":\\s*\\[\\s*(\\d+),\\s*(\\d+),\\s*(\\d+)"))) {
    std::fprintf(stderr, "no shape in the manifest\n");
    std::exit(2);
  }
  m.M = std::stoll(g[1]);
  m.N = std::stoll(g[2]);
  m.K = std::stoll(g[3]);
  if (std::regex_search(text, g, std::regex("\"dtype\":\\s*\"(\\w+)\""))) m.dtype = g[1];
  m.persistent = std::regex_search(text, std::regex("\"persistent\":\\s*true"));
  if (std::regex_search(text, g, std::regex("\"cluster\":\\s*(\\d+)"))) m.cluster = std::stoi(g[1]);
  if (std::regex_search(text, g, std::regex("\"threads\":\\s*(\\d+)"))) m.threads = std::stoi(g[1]);
  if (std::regex_search(text, g, std::regex("\"smem_bytes\":\\s*(\\d+)"))) m.smem_bytes = std::stoi(g[1]);
  // the spec's operands: {"name": ..., "dtype": ..., "shape": [...], "role": "epilogue"}, in order
  const std::regex operand("\\{[^{}]*\"role\":\\s*\"epilogue\"[^{}]*\\}"), name("\"name\":\\s*\"(\\w+)\"");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), operand); it != std::sregex_iterator(); ++it) {
    const std::string block = it->str();
    std::smatch n;
    if (std::regex_search(block, n, name)) m.epilogue.push_back(n[1]);
  }
  if (std::regex_search(text, g, std::regex("\"act\":\\s*\"(\\w+)\""))) m.act = g[1];
  // the .so must be the size export recorded: the dynamic loader crashes on a truncated copy
  if (!std::regex_search(text, g, std::regex("\"so_bytes\":\\s*(\\d+)"))) {
    std::fprintf(stderr, "%s.json records no so_bytes: re-export the module\n", so_path.c_str());
    std::exit(2);
  }
  std::ifstream so(so_path, std::ios::binary | std::ios::ate);
  const long long have = so ? static_cast<long long>(so.tellg()) : -1;
  if (have != std::stoll(g[1])) {
    std::fprintf(stderr, "%s is %lld bytes but its manifest says %s: copy it again, or re-export\n",
                 so_path.c_str(), have, g[1].str().c_str());
    std::exit(2);
  }
  return m;
}

// float -> IEEE half / bfloat16 bits, round to nearest even (finite normal inputs only).
uint16_t ToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  int32_t exp = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffffu;
  if (exp <= 0) return static_cast<uint16_t>(sign);  // flush tiny values
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  uint32_t h = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(h);
}
float FromHalf(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, x;
  if (exp == 0) {
    float f = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -f : f;
  }
  if (exp == 31) x = sign | 0x7f800000u | (mant << 13);
  else x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
uint16_t ToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}
float FromBf16(uint16_t b) {
  uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

DLTensor View(void* data, int64_t* shape, DLDataType dt, int ndim = 2) {
  DLTensor t{};
  t.data = data;
  t.device = DLDevice{kDLCUDA, 0};
  t.ndim = ndim;
  t.dtype = dt;
  t.shape = shape;
  return t;
}

// Clusters of `cluster` CTAs (`threads` threads, `smem` bytes of dynamic shared memory each) that
// the GPU runs at once, or 0 when the driver cannot say. As gemm_ladder.core.device.max_active_clusters:
// cuOccupancyMaxActiveClusters asked of an empty kernel loaded from PTX, launched like the module
// (TVM's module does not hand out its function). The CUDA context must be current.
int MaxActiveClusters(int cluster, int threads, int smem) {
  struct LaunchAttr { int id; char pad[4]; unsigned value[16]; };  // CUlaunchAttribute
  struct LaunchCfg {  // CUlaunchConfig
    unsigned grid[3], block[3], smem;
    void* stream;
    LaunchAttr* attrs;
    unsigned num_attrs;
  };
  static const char kPtx[] =
      ".version 8.0\n.target sm_90\n.address_size 64\n"
      ".visible .entry gemm_ladder_cluster_probe()\n{\n  ret;\n}\n";
  void* cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!cu) return 0;
  using LoadData = int (*)(void**, const void*);
  using GetFunction = int (*)(void**, void*, const char*);
  using SetAttribute = int (*)(void*, int, int);
  using Occupancy = int (*)(int*, void*, const LaunchCfg*);
  using Unload = int (*)(void*);
  auto load = reinterpret_cast<LoadData>(dlsym(cu, "cuModuleLoadData"));
  auto get = reinterpret_cast<GetFunction>(dlsym(cu, "cuModuleGetFunction"));
  auto set = reinterpret_cast<SetAttribute>(dlsym(cu, "cuFuncSetAttribute"));
  auto occupancy = reinterpret_cast<Occupancy>(dlsym(cu, "cuOccupancyMaxActiveClusters"));
  auto unload = reinterpret_cast<Unload>(dlsym(cu, "cuModuleUnload"));
  if (!load || !get || !set || !occupancy || !unload) return 0;
  void *mod = nullptr, *fn = nullptr;
  if (load(&mod, kPtx) != 0) return 0;
  int count = 0;
  LaunchAttr attr{};
  attr.id = 4;  // CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
  attr.value[0] = cluster;
  attr.value[1] = attr.value[2] = 1;
  LaunchCfg cfg{{unsigned(cluster), 1, 1}, {unsigned(threads), 1, 1}, unsigned(smem), nullptr, &attr, 1};
  const bool asked = get(&fn, mod, "gemm_ladder_cluster_probe") == 0 &&
                     set(fn, 8 /* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES */, smem) == 0 &&
                     occupancy(&count, fn, &cfg) == 0;
  unload(mod);
  return asked ? count : 0;
}

void LoadCudaBackend() {
  std::string dir;
  if (const char* env = std::getenv("TVM_LIBRARY_DIR")) {
    dir = env;
  } else {
    Dl_info info{};
    void* sym = dlsym(RTLD_DEFAULT, "TVMFFIFunctionCall");
    if (sym && dladdr(sym, &info) && info.dli_fname) {
      dir = info.dli_fname;
      dir = dir.substr(0, dir.find_last_of('/'));
    }
  }
  const std::string candidates[] = {dir + "/libtvm_runtime_cuda.so", "libtvm_runtime_cuda.so"};
  for (const auto& c : candidates) {
    if (dlopen(c.c_str(), RTLD_NOW | RTLD_GLOBAL)) return;
  }
  std::fprintf(stderr, "could not load libtvm_runtime_cuda.so (%s); set TVM_LIBRARY_DIR to TVM's lib/\n", dlerror());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODULE.so [--reps N]\n", argv[0]);
    return 2;
  }
  const std::string path = argv[1];
  int reps = 50;
  for (int i = 2; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--reps") reps = std::atoi(argv[i + 1]);
  const Manifest man = ReadManifest(path);
  const bool bf16 = man.dtype == "bfloat16";
  if (!bf16 && man.dtype != "float16") {
    std::fprintf(stderr, "dtype %s is not supported by the runner\n", man.dtype.c_str());
    return 2;
  }
  for (const auto& op : man.epilogue) {
    if (op != "bias") {
      std::fprintf(stderr, "the module's epilogue takes %s, which the runner does not fill yet (it fills a bias)\n",
                   op.c_str());
      return 2;
    }
  }
  const bool has_bias = !man.epilogue.empty();
  // the spec's activation on the fp64 reference, as torch computes it (gemm_ladder.core.spec.ACTIVATIONS)
  const auto activate = [&man](double x) {
    if (man.act == "relu") return x > 0 ? x : 0.0;
    if (man.act == "gelu_tanh") return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    if (man.act == "gelu_erf") return 0.5 * x * (1 + std::erf(x * 0.7071067811865476));
    if (man.act == "silu") return x / (1 + std::exp(-x));
    return x;
  };
  if (man.act != "none" && man.act != "relu" && man.act != "gelu_tanh" && man.act != "gelu_erf" && man.act != "silu") {
    std::fprintf(stderr, "the module's activation %s is not one the runner knows (none, relu, gelu_tanh, gelu_erf, "
                 "silu)\n", man.act.c_str());
    return 2;
  }
  LoadCudaBackend();
  tvm::ffi::Module mod = tvm::ffi::Module::LoadFromFile(path);
  tvm::ffi::Function fn = mod->GetFunction("main").value();

  const int64_t M = man.M, N = man.N, K = man.K;
  std::mt19937 rng(0);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> a(M * K), b(N * K), d(M * N), bias(has_bias ? N : 1, 0);
  for (auto& v : a) v = bf16 ? ToBf16(normal(rng)) : ToHalf(normal(rng));
  for (auto& v : b) v = bf16 ? ToBf16(normal(rng)) : ToHalf(normal(rng));
  if (has_bias)
    for (auto& v : bias) v = bf16 ? ToBf16(normal(rng)) : ToHalf(normal(rng));
  auto to_float = [bf16](uint16_t v) { return bf16 ? FromBf16(v) : FromHalf(v); };

  void *da, *db, *dd, *dbias;
  CUDA_OK(cudaMalloc(&dbias, bias.size() * 2));
  CUDA_OK(cudaMemcpy(dbias, bias.data(), bias.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMalloc(&da, a.size() * 2));
  CUDA_OK(cudaMalloc(&db, b.size() * 2));
  CUDA_OK(cudaMalloc(&dd, d.size() * 2));
  CUDA_OK(cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dd, 0xff, d.size() * 2));  // NaN in both formats: unwritten outputs show
  int64_t sa[2] = {M, K}, sb[2] = {N, K}, sd[2] = {M, N}, sbias[1] = {N};
  const DLDataType dt{static_cast<uint8_t>(bf16 ? kDLBfloat : kDLFloat), 16, 1};
  DLTensor ta = View(da, sa, dt), tb = View(db, sb, dt), td = View(dd, sd, dt), tbias = View(dbias, sbias, dt, 1);
  // a persistent module: one CTA per SM in whole clusters, no more clusters than run at once
  // (as gemm_ladder.serve.runtime.persistent_grid)
  int sms = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  sms = sms / man.cluster * man.cluster;
  if (man.persistent && man.cluster > 1) {
    const int fit = MaxActiveClusters(man.cluster, man.threads, man.smem_bytes);
    if (fit > 0) sms = std::min(sms, fit * man.cluster);
    else std::fprintf(stderr, "the driver could not say how many clusters of %d run at once; launching %d CTAs\n",
                      man.cluster, sms);
  }
  auto launch = [&] {  // A, B, D, the launch scalars, then the spec's epilogue operands
    if (man.persistent && has_bias) fn(&ta, &tb, &td, sms, &tbias);
    else if (man.persistent) fn(&ta, &tb, &td, sms);
    else if (has_bias) fn(&ta, &tb, &td, &tbias);
    else fn(&ta, &tb, &td);
  };
  launch();
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemcpy(d.data(), dd, d.size() * 2, cudaMemcpyDeviceToHost));

  // Reference in double on up to 16 rows spread over M (every column of each).
  double err2 = 0, ref2 = 0;
  int64_t nan = 0;
  const int64_t rows = std::min<int64_t>(M, 16);
  for (int64_t s = 0; s < rows; ++s) {
    const int64_t i = s * (M - 1) / std::max<int64_t>(rows - 1, 1);
    for (int64_t j = 0; j < N; ++j) {
      double acc = has_bias ? double(to_float(bias[j])) : 0.0;
      for (int64_t k = 0; k < K; ++k) acc += double(to_float(a[i * K + k])) * to_float(b[j * K + k]);
      acc = activate(acc);
      const float got = to_float(d[i * N + j]);
      if (std::isnan(got)) ++nan;
      err2 += (got - acc) * (got - acc);
      ref2 += acc * acc;
    }
  }
  const double rel = std::sqrt(err2 / std::max(ref2, 1e-30));

  cudaEvent_t e0, e1;
  CUDA_OK(cudaEventCreate(&e0));
  CUDA_OK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int r = 0; r < reps + 5; ++r) {
    CUDA_OK(cudaEventRecord(e0));
    launch();
    CUDA_OK(cudaEventRecord(e1));
    CUDA_OK(cudaEventSynchronize(e1));
    float t = 0;
    CUDA_OK(cudaEventElapsedTime(&t, e0, e1));
    if (r >= 5) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  const double tol = bf16 ? 1e-2 : 2e-3;
  const bool ok = nan == 0 && rel < tol;
  const std::string grid = man.persistent ? "  CTAs " + std::to_string(sms) : "";
  std::printf("%s  %lldx%lldx%lld %s%s  rel_err %.2e  unwritten %lld  %.3f ms  %.1f TFLOPS  %s\n",
              path.c_str(), static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K),
              man.dtype.c_str(), grid.c_str(), rel, static_cast<long long>(nan), med, 2.0 * M * N * K / med / 1e9,
              ok ? "OK" : "WRONG");
  cudaFree(da);
  cudaFree(db);
  cudaFree(dd);
  cudaFree(dbias);
  return ok ? 0 : 1;
}
