// The LibTorch host services: call_eager runs ATen ops through the dispatcher on DLTensors wrapped
// without copying, and device memory comes from LibTorch's allocator.
#include <ATen/DLConvertor.h>
#include <torch/torch.h>

#include <gtest/gtest.h>

#include "kiln/internal/host_services.h"
#include "kiln/plugin_api.h"

namespace {

DLTensor dl_of(const at::Tensor& t) {
  DLTensor d{};
  at::toDLPackNonOwning(t, &d);
  return d;
}

KilnArg arg(KilnArgTag tag, const char* name) {
  KilnArg a{};
  a.struct_size = KILN_ARG_STRUCT_SIZE;
  a.tag = tag;
  a.name = name;
  return a;
}

std::pair<KilnErrorCode, std::string> take(const KilnHostApi* api, KilnError* e) {
  if (!e) return {0, ""};
  std::pair<KilnErrorCode, std::string> r{api->error_code(e), api->error_message(e)};
  api->error_destroy(e);
  return r;
}

KilnError* call_eager(const KilnHostApi* api, const char* op, const KilnArg* const* args, size_t num_args,
                      DLTensor* outputs, size_t num_outputs) {
  KilnHostCallEagerArgs a{
      KILN_HOST_CALL_EAGER_ARGS_STRUCT_SIZE, api->host_ctx, op, args, num_args, outputs, num_outputs};
  return api->call_eager(&a);
}

std::shared_ptr<kiln::HostServices> host() {
  kiln::TrainingArguments args;
  args.runtime.cache_dir = "/tmp/kiln-torch-host-test";
  return kiln::torch_host_services(args);
}

}  // namespace

TEST(TorchHost, CallEagerRunsAddmmLikeAten) {
  auto h = host();
  const KilnHostApi* api = h->api();
  ASSERT_NE(api->call_eager, nullptr);
  at::Tensor bias = torch::randn({3}), m1 = torch::randn({4, 5}), m2 = torch::randn({5, 3});
  at::Tensor out = torch::full({4, 3}, NAN);
  DLTensor db = dl_of(bias), d1 = dl_of(m1), d2 = dl_of(m2), dout = dl_of(out);
  KilnArg a_self = arg(KILN_ARG_TENSOR, "self"), a_m1 = arg(KILN_ARG_TENSOR, "mat1"),
          a_m2 = arg(KILN_ARG_TENSOR, "mat2");
  a_self.tensor = &db;
  a_m1.tensor = &d1;
  a_m2.tensor = &d2;
  KilnArg beta = arg(KILN_ARG_DOUBLE, "beta"), alpha = arg(KILN_ARG_INT, "alpha");
  beta.d = 0.5;
  alpha.i = 2;
  const KilnArg* args[] = {&a_self, &a_m1, &a_m2, &beta, &alpha};
  auto [code, msg] = take(api, call_eager(api, "aten::addmm", args, 5, &dout, 1));
  ASSERT_EQ(code, 0) << msg;
  EXPECT_TRUE(torch::allclose(out, torch::addmm(bias, m1, m2, 0.5, 2), 1e-5, 1e-6));
}

TEST(TorchHost, CallEagerWrapsInputsWithoutCopying) {
  auto h = host();
  const KilnHostApi* api = h->api();
  at::Tensor x = torch::randn({6}), y = torch::randn({6});
  at::Tensor expected = x * y;
  at::Tensor result = torch::empty({6});
  DLTensor dx = dl_of(x), dy = dl_of(y), dr = dl_of(result);
  KilnArg s = arg(KILN_ARG_TENSOR, "self"), o = arg(KILN_ARG_TENSOR, "other");
  s.tensor = &dx;
  o.tensor = &dy;
  const KilnArg* args[] = {&s, &o};
  // In place: if x had been copied on the way in, x itself would be unchanged.
  auto [code, msg] = take(api, call_eager(api, "aten::mul_.Tensor", args, 2, &dr, 1));
  ASSERT_EQ(code, 0) << msg;
  EXPECT_TRUE(torch::equal(x, expected));
  EXPECT_TRUE(torch::equal(result, expected));
}

TEST(TorchHost, CallEagerReportsUnknownOpsAndWrongArity) {
  auto h = host();
  const KilnHostApi* api = h->api();
  at::Tensor x = torch::randn({2});
  DLTensor dx = dl_of(x);
  KilnArg s = arg(KILN_ARG_TENSOR, "self");
  s.tensor = &dx;
  const KilnArg* args[] = {&s};
  EXPECT_EQ(take(api, call_eager(api, "aten::no_such_op", args, 1, &dx, 1)),
            std::make_pair(KilnErrorCode(KILN_ERROR_INVALID_ARGUMENT),
                           std::string("call_eager: no ATen operator 'aten::no_such_op'")));
  EXPECT_EQ(take(api, call_eager(api, "aten::add.Tensor", args, 1, &dx, 1)),
            std::make_pair(KilnErrorCode(KILN_ERROR_INVALID_ARGUMENT),
                           std::string("call_eager: aten::add.Tensor takes 3 arguments, got 1")));
  at::Tensor wrong = torch::empty({3});
  DLTensor dw = dl_of(wrong);
  EXPECT_EQ(
      take(api, call_eager(api, "aten::relu", args, 1, &dw, 1)),
      std::make_pair(KilnErrorCode(KILN_ERROR_INVALID_ARGUMENT),
                     std::string("call_eager: aten::relu output 0 is Float[2], the caller's buffer is Float[3]")));
}

TEST(TorchHost, DeviceMemoryComesFromLibTorchAndIsFreed) {
  auto h = host();
  const KilnHostApi* api = h->api();
  KilnHostDeviceAllocArgs alloc{
      KILN_HOST_DEVICE_ALLOC_ARGS_STRUCT_SIZE, api->host_ctx, DLDevice{kDLCPU, 0}, 4096, nullptr, nullptr};
  auto [code, msg] = take(api, api->device_alloc(&alloc));
  ASSERT_EQ(code, 0) << msg;
  ASSERT_NE(alloc.ptr, nullptr);
  std::memset(alloc.ptr, 7, 4096);
  KilnHostDeviceFreeArgs release{KILN_HOST_DEVICE_FREE_ARGS_STRUCT_SIZE, api->host_ctx, DLDevice{kDLCPU, 0}, alloc.ptr};
  api->device_free(&release);
  KilnHostCacheDirArgs dir{KILN_HOST_CACHE_DIR_ARGS_STRUCT_SIZE, api->host_ctx, nullptr};
  api->cache_dir(&dir);
  EXPECT_STREQ(dir.cache_dir, "/tmp/kiln-torch-host-test");
}
