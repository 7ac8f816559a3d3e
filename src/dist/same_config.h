// The start-up check every multi-rank layout makes: one run, one config.
#pragma once

#include "memtrain/dist/communicator.h"

#include <nlohmann/json.hpp>

namespace memtrain::dist::detail {

// Refuses (on every rank, raising memtrain::Error(where, ...)) a config that is not rank 0's on every rank, naming
// the ranks that differ and the first field that does. Every rank of `comm` calls it together.
void require_same_config(const nlohmann::json& config, Communicator& comm, const char* where);

}  // namespace memtrain::dist::detail
