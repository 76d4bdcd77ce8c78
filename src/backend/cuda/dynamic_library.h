// Libraries the CUDA backend opens at run time (dlopen) instead of linking -- cuBLASLt for the bench's
// ceilings, NCCL for multi-GPU, CUPTI for the kernel trace -- so the binaries run where they are absent
// and only the feature that needs one fails, with the reason.
#pragma once

#include <dlfcn.h>

#include <cstring>
#include <string>
#include <vector>

namespace di::cuda {

// The first of `names` (sonames or paths) that opens, RTLD_NOW | RTLD_LOCAL; nullptr if none does.
inline void* open_first_library(const std::vector<std::string>& names) {
  for (const std::string& n : names)
    if (void* lib = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL)) return lib;
  return nullptr;
}

// fn = the function `name` of `lib`; false (fn null) when the library lacks it.
template <class Fn>
bool load_symbol(void* lib, Fn& fn, const char* name) {
  void* p = dlsym(lib, name);
  std::memcpy(&fn, &p, sizeof fn);  // object -> function pointer without a pedantic cast
  return p != nullptr;
}

}  // namespace di::cuda
