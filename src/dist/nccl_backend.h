// The NCCL group as libmemtrain's dist code sees it. The group needs CUDA and NCCL, so it is built into the CUDA
// module (src/dist/nccl_communicator.cpp, compiled into libmemtrain_cuda.so) and exports an entry that
// dist::make_nccl_communicator finds through core's cuda_module_symbol: libmemtrain itself links neither.
// Both sides are built from this header in the same build.
#pragma once

#include "memtrain/dist/communicator.h"

#include <memory>
#include <string>

namespace memtrain::dist::detail {

inline constexpr const char* kNcclGroupSymbol = "memtrain_nccl_group";

struct NcclGroupEntry {
  // The group over `bootstrap`'s ranks, or nullptr with `why` set (a build without NCCL, a rank without a GPU).
  std::shared_ptr<Communicator> (*make)(std::shared_ptr<Communicator> bootstrap, std::string& why) = nullptr;
};

}  // namespace memtrain::dist::detail
