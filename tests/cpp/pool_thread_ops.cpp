// The core library's per-thread block pool at a thread's end (tests/test_pool_threads.py): a thread whose
// first free of a Tensor comes in a pthread key's destructor, after its thread_local destructors ran.
#include <malloc.h>
#include <pthread.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "opbuilder/extension.h"

using namespace opbuilder;

namespace {

struct Holder {
  std::vector<TensorPtr> tensors;
};

pthread_key_t key;
pthread_once_t once = PTHREAD_ONCE_INIT;
void FreeHolder(void *p) { delete static_cast<Holder *>(p); }
void MakeKey() { pthread_key_create(&key, FreeHolder); }

std::vector<TensorPtr> Make(int n) {
  std::vector<TensorPtr> v;
  for (int i = 0; i < n; ++i) v.push_back(Tensor::zeros(kFloat64, {1 + i % 8}));
  return v;
}

}  // namespace

// `threads` threads, one after another, each handed 40 Tensors that its pthread key's destructor frees.
std::int64_t FreeInKeyDestructors(std::int64_t threads) {
  pthread_once(&once, MakeKey);
  for (std::int64_t k = 0; k < threads; ++k) {
    auto made = Make(40);
    std::thread([&made] {
      auto *h = new Holder;
      h->tensors = std::move(made);
      pthread_setspecific(key, h);
    }).join();
  }
  return threads;
}

// Bytes malloc has handed out and not had back, in every arena.
std::int64_t HeapInUse() { return static_cast<std::int64_t>(mallinfo2().uordblks); }

OB_MODULE(m) {
  m.def("free_in_key_destructors", &FreeInKeyDestructors);
  m.def("heap_in_use", &HeapInUse);
}
