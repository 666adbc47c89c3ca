// The engine's counters in the Prometheus text exposition format (version 0.0.4), named as vLLM
// users know them with a `kvmesh:` prefix.
#pragma once

#include <string>

#include "server/engine_loop.h"

namespace kvmesh::server {

std::string PrometheusText(const EngineSnapshot& s, const std::string& model_name);

}  // namespace kvmesh::server
