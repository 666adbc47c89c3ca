// The engine's counters in the Prometheus text exposition format (version 0.0.4), named as vLLM
// users know them with a `kvmesh:` prefix.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "server/engine_loop.h"

namespace kvmesh::server {

// (status code, responses sent with it), in code order: the HTTP server's answers.
using ResponseCounts = std::vector<std::pair<int, int64_t>>;

// http_responses: kvmesh:http_responses_total's series, one per code (none: the family is left
// out, as it is for a code no response has had yet).
std::string PrometheusText(const EngineSnapshot& s, const std::string& model_name,
                           const ResponseCounts& http_responses = {});

}  // namespace kvmesh::server
