// The engine loop on the real model: a shutdown's drain lets accepted requests finish until its
// deadline, then ends the rest as Unavailable (the HTTP API's 503), and refuses new ones.
#include "server/engine_loop.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

#include "serving/serving_engine.h"
#include "tests/util/test_paths.h"
#include "worker/engine.h"

namespace kvmesh::server {
namespace {

TEST(EngineLoop, DrainDeadlineEndsWhatIsLeftAsUnavailable) {
  const std::string path = testing::RealModelPath();
  if (path.empty()) {
    GTEST_SKIP() << "SmolLM2 model not found: run scripts/model_pull.sh (or set KVMESH_MODEL)";
  }
  worker::EngineOptions o;
  o.model_path = path;
  o.threads = 2;
  o.ctx_size = 4096;
  o.kv_cache_bytes = 64ll << 20;
  auto engine = worker::Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  serving::ServingEngine se(**engine, {});
  EngineLoop loop(se);
  std::promise<serving::Completion> done;
  std::promise<absl::Status> accepted;
  std::atomic<int> tokens{0};
  serving::Request r;
  r.prompt = {1, 2, 3};
  r.max_tokens = 2000;  // within the pool (2,912 tokens), far more than the drain below allows
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  loop.Submit(r,
              {.on_token = [&](serving::RequestId, int32_t) { ++tokens; },
               .on_done = [&](const serving::Completion& c) { done.set_value(c); }},
              [&](absl::StatusOr<serving::RequestId> id) { accepted.set_value(id.status()); });
  std::thread run([&] { EXPECT_TRUE(loop.Run().ok()); });
  auto ok = accepted.get_future().get();
  if (!ok.ok()) {
    loop.Stop();
    run.join();
    FAIL() << ok;
  }
  for (int i = 0; i < 60000 && tokens < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_GE(tokens, 2);
  loop.Stop(std::chrono::milliseconds(200));
  const serving::Completion c = done.get_future().get();
  run.join();
  EXPECT_TRUE(absl::IsUnavailable(c.status)) << c.status;
  EXPECT_LT(c.tokens.size(), 2000u);
  // Once stopped, a submission is refused as Unavailable too.
  std::promise<absl::Status> refused;
  loop.Submit(r, {},
              [&](absl::StatusOr<serving::RequestId> id) { refused.set_value(id.status()); });
  EXPECT_TRUE(absl::IsUnavailable(refused.get_future().get()));
  se.scheduler().DropSessions();
  EXPECT_EQ(se.scheduler().blocks().referenced(), 0);
}

}  // namespace
}  // namespace kvmesh::server
