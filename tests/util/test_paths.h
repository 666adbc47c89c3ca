// Test helper: where fixtures and the real model live.
#pragma once

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace kvmesh::testing {

inline std::string FixturePath(const std::string& name) {
  return std::string(KVMESH_FIXTURES_DIR) + "/" + name;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// $KVMESH_MODEL, else the file `kvmesh model pull` writes. Empty if it does not exist.
inline std::string RealModelPath() {
  std::string p;
  if (const char* m = std::getenv("KVMESH_MODEL"); m && *m) {
    p = m;
  } else {
    const char* c = std::getenv("KVMESH_CACHE");
    const char* h = std::getenv("HOME");
    p = (c && *c ? std::string(c) : std::string(h ? h : ".") + "/.cache/kvmesh") +
        "/SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  std::ifstream f(p);
  return f.good() ? p : std::string();
}

#define KVMESH_REQUIRE_MODEL(path)                                                \
  const std::string path = ::kvmesh::testing::RealModelPath();                    \
  if (path.empty()) {                                                             \
    GTEST_SKIP() << "SmolLM2 model not found: run scripts/model_pull.sh (or set " \
                    "KVMESH_MODEL) to run this test";                             \
  }

}  // namespace kvmesh::testing
