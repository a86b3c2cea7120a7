// horo's TensorFlow kernel: HoroWait, an asynchronous op that completes when horo's engine has run the
// collective that Python submitted under the same ticket (horo/tensorflow/kernel.py builds this file).
//
// A graph evaluates independent collectives in any order, on any number of inter-op threads. A kernel that
// blocked its thread until every rank had submitted the same collective could leave one rank's threads all
// waiting for collectives that another rank has not reached: HoroWait parks its context and returns at once,
// and horo_tf_deliver (called from Python through ctypes when the engine finishes the op) fills its outputs,
// or sets the error status whose code Python chose, and calls the executor back.

#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::CancellationManager;
using tensorflow::CancellationToken;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

// A result that came before its kernel ran: its bytes are copied, since Python frees its arrays on return.
struct Output {
  std::vector<int64_t> dims;
  std::vector<char> bytes;
};

struct Result {
  int code = 0;
  std::string message;
  std::vector<Output> outputs;
};

struct Waiter {
  OpKernelContext* ctx;
  AsyncOpKernel::DoneCallback done;
  CancellationManager* cm;
  CancellationToken token;
};

std::mutex mu;
std::unordered_map<int64_t, Result> early;    // results whose kernel has not run yet
std::unordered_map<int64_t, Waiter> waiting;  // kernels whose result has not come yet
std::unordered_set<int64_t> abandoned;        // kernels cancelled before their result came

void Fail(OpKernelContext* ctx, int code, const std::string& message) {
  ctx->SetStatus(absl::Status(static_cast<absl::StatusCode>(code), message));
}

// Allocates output i with the given dims and copies nbytes into it; false (status set) on a mismatch.
bool Emit(OpKernelContext* ctx, int i, const int64_t* dims, int ndims, const void* data, int64_t nbytes) {
  TensorShape shape;
  for (int d = 0; d < ndims; ++d) {
    absl::Status s = shape.AddDimWithStatus(dims[d]);
    if (!s.ok()) {
      ctx->SetStatus(s);
      return false;
    }
  }
  Tensor* out = nullptr;
  absl::Status s = ctx->allocate_output(i, shape, &out);
  if (!s.ok()) {
    ctx->SetStatus(s);
    return false;
  }
  if (static_cast<int64_t>(out->TotalBytes()) != nbytes) {
    Fail(ctx, static_cast<int>(absl::StatusCode::kInternal),
         "horo: output " + std::to_string(i) + " has " + std::to_string(nbytes) + " bytes for a tensor of " +
             std::to_string(out->TotalBytes()));
    return false;
  }
  if (nbytes > 0) std::memcpy(out->data(), data, nbytes);
  return true;
}

void EmitResult(OpKernelContext* ctx, const Result& r) {
  if (r.code != 0) {
    Fail(ctx, r.code, r.message);
    return;
  }
  if (static_cast<int>(r.outputs.size()) != ctx->num_outputs()) {
    Fail(ctx, static_cast<int>(absl::StatusCode::kInternal), "horo: wrong number of outputs");
    return;
  }
  for (int i = 0; i < ctx->num_outputs(); ++i) {
    const Output& o = r.outputs[i];
    if (!Emit(ctx, i, o.dims.data(), static_cast<int>(o.dims.size()), o.bytes.data(),
              static_cast<int64_t>(o.bytes.size())))
      return;
  }
}

void Cancel(int64_t ticket) {
  std::unique_lock<std::mutex> lock(mu);
  auto it = waiting.find(ticket);
  if (it == waiting.end()) return;  // its result is being delivered
  Waiter w = std::move(it->second);
  waiting.erase(it);
  abandoned.insert(ticket);
  lock.unlock();
  Fail(w.ctx, static_cast<int>(absl::StatusCode::kCancelled), "horo: the step was cancelled");
  w.done();
}

class HoroWaitOp : public AsyncOpKernel {
 public:
  explicit HoroWaitOp(OpKernelConstruction* c) : AsyncOpKernel(c) {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const int64_t ticket = ctx->input(0).scalar<int64_t>()();
    std::unique_lock<std::mutex> lock(mu);
    auto it = early.find(ticket);
    if (it != early.end()) {
      Result r = std::move(it->second);
      early.erase(it);
      lock.unlock();
      EmitResult(ctx, r);
      done();
      return;
    }
    CancellationManager* cm = ctx->cancellation_manager();
    CancellationToken token = 0;
    if (cm != nullptr) {
      token = cm->get_cancellation_token();
      if (!cm->RegisterCallback(token, [ticket]() { Cancel(ticket); })) {
        abandoned.insert(ticket);
        lock.unlock();
        Fail(ctx, static_cast<int>(absl::StatusCode::kCancelled), "horo: the step was cancelled");
        done();
        return;
      }
    }
    waiting.emplace(ticket, Waiter{ctx, std::move(done), cm, token});
  }
};

}  // namespace

REGISTER_OP("HoroWait")
    .Input("ticket: int64")
    .Output("outputs: T")
    .Attr("T: list(type) >= 1")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->UnknownShape());
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("HoroWait").Device(tensorflow::DEVICE_CPU), HoroWaitOp);

// Delivers the result of ticket: n outputs (data[i], nbytes[i], ndims[i] dims taken in turn from dims), or,
// with code != 0, a TensorFlow error status (absl::StatusCode) carrying message.
// Returns 2 when a waiting kernel was completed, 1 when the result was kept for its kernel, 0 when dropped.
extern "C" __attribute__((visibility("default"))) int horo_tf_deliver(int64_t ticket, int code,
                                                                       const char* message, int n,
                                                                       const void* const* data,
                                                                       const int64_t* nbytes, const int* ndims,
                                                                       const int64_t* dims) {
  std::unique_lock<std::mutex> lock(mu);
  if (abandoned.erase(ticket) > 0) return 0;
  auto it = waiting.find(ticket);
  if (it == waiting.end()) {
    Result r;
    r.code = code;
    if (code != 0) r.message = message == nullptr ? "" : message;
    const int64_t* d = dims;
    for (int i = 0; code == 0 && i < n; ++i) {
      Output o;
      o.dims.assign(d, d + ndims[i]);
      d += ndims[i];
      const char* p = static_cast<const char*>(data[i]);
      o.bytes.assign(p, p + nbytes[i]);
      r.outputs.push_back(std::move(o));
    }
    early[ticket] = std::move(r);
    return 1;
  }
  Waiter w = std::move(it->second);
  waiting.erase(it);
  lock.unlock();
  // A cancellation running now finds no waiter and does nothing; this call completes the kernel.
  if (w.cm != nullptr) w.cm->TryDeregisterCallback(w.token);
  if (code != 0) {
    Fail(w.ctx, code, message == nullptr ? "" : message);
  } else if (n != w.ctx->num_outputs()) {
    Fail(w.ctx, static_cast<int>(absl::StatusCode::kInternal), "horo: wrong number of outputs");
  } else {
    const int64_t* d = dims;
    for (int i = 0; i < n; ++i) {
      if (!Emit(w.ctx, i, d, ndims[i], data[i], nbytes[i])) break;
      d += ndims[i];
    }
  }
  w.done();
  return 2;
}

// How many results and kernels are parked (tests check that nothing is left behind).
extern "C" __attribute__((visibility("default"))) int64_t horo_tf_parked() {
  std::lock_guard<std::mutex> lock(mu);
  return static_cast<int64_t>(early.size() + waiting.size());
}
