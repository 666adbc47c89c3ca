#include "server/metrics_text.h"

#include <charconv>
#include <vector>

#include "util/str_cat.h"

namespace kvmesh::server {

namespace {

// The shortest text that reads back as v ("0.1", not "0.10000000000000001"), as Prometheus'
// client libraries write numbers: label values like le="0.1" are matched as text.
std::string Num(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

// A label value as the text format escapes it: backslash, double quote and newline.
std::string LabelValue(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

class Writer {
 public:
  explicit Writer(const std::string& model)
      : labels_(StrCat("model_name=\"", LabelValue(model), "\"")) {}
  void Metric(const char* name, const char* type, const char* help, double value) {
    out_ += StrCat("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n", name, "{",
                   labels_, "} ", Num(value), "\n");
  }
  // One series per data-parallel replica, labelled replica="r".
  template <typename F>
  void PerReplica(const char* name, const char* type, const char* help,
                  const std::vector<serving::SchedulerStats>& replicas, F value) {
    out_ += StrCat("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
    for (size_t r = 0; r < replicas.size(); ++r) {
      out_ += StrCat(name, "{", labels_, ",replica=\"", r, "\"} ", Num(value(replicas[r])), "\n");
    }
  }
  void Histogram(const char* name, const char* help, const serving::Histogram& h) {
    out_ += StrCat("# HELP ", name, " ", help, "\n# TYPE ", name, " histogram\n");
    int64_t cumulative = 0;
    const auto& bounds = h.upper_bounds();
    for (size_t i = 0; i <= bounds.size(); ++i) {
      cumulative += h.bucket_counts()[i];
      const std::string le = i < bounds.size() ? Num(bounds[i]) : "+Inf";
      out_ += StrCat(name, "_bucket{", labels_, ",le=\"", le, "\"} ", cumulative, "\n");
    }
    out_ += StrCat(name, "_sum{", labels_, "} ", Num(h.sum()), "\n", name, "_count{", labels_, "} ",
                   h.count(), "\n");
  }
  // One series per HTTP status code, labelled code="400".
  void PerCode(const char* name, const char* help, const ResponseCounts& counts) {
    if (counts.empty()) return;
    out_ += StrCat("# HELP ", name, " ", help, "\n# TYPE ", name, " counter\n");
    for (const auto& [code, n] : counts) {
      out_ += StrCat(name, "{", labels_, ",code=\"", code, "\"} ", n, "\n");
    }
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string labels_, out_;
};

}  // namespace

std::string PrometheusText(const EngineSnapshot& s, const std::string& model_name,
                           const ResponseCounts& http_responses) {
  Writer w(model_name);
  const serving::SchedulerStats& st = s.stats;
  w.Metric("kvmesh:num_requests_running", "gauge", "Requests in the running batch.", st.running);
  w.Metric("kvmesh:num_requests_waiting", "gauge", "Requests waiting to be scheduled.", st.waiting);
  w.Metric("kvmesh:kv_cache_usage_perc", "gauge",
           "Fraction of KV blocks referenced by requests and sessions (1 = full).",
           st.blocks_total > 0 ? static_cast<double>(st.blocks_used) / st.blocks_total : 0.0);
  w.Metric("kvmesh:kv_cache_num_blocks", "gauge",
           "KV blocks in the pool (one rank's, summed over data-parallel replicas).",
           st.blocks_total);
  w.Metric("kvmesh:kv_cache_blocks_cached", "gauge",
           "Unreferenced KV blocks kept for prefix reuse.", st.blocks_cached);
  w.Metric("kvmesh:kv_cache_blocks_free", "gauge", "KV blocks holding nothing.", st.blocks_free);
  w.Metric("kvmesh:prefix_cache_queries_total", "counter",
           "Prompt tokens looked up in the prefix cache.", st.prefix_query_tokens);
  w.Metric("kvmesh:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.",
           st.prefix_hit_tokens);
  w.Metric("kvmesh:num_preemptions_total", "counter", "Sequences preempted (recomputed later).",
           st.preemptions);
  w.Metric("kvmesh:kv_cache_evictions_total", "counter", "Cached KV blocks evicted.", st.evictions);
  w.Metric("kvmesh:prompt_tokens_total", "counter",
           "Prompt tokens computed (cache hits left out, recomputation after preemption counted).",
           st.prompt_tokens_computed);
  w.Metric("kvmesh:generation_tokens_total", "counter", "Tokens generated.", st.generated_tokens);
  w.Metric("kvmesh:request_success_total", "counter", "Requests finished.", st.finished);
  w.Metric("kvmesh:request_failed_total", "counter",
           "Requests ended by an error of the engine (a failed step).", st.failed);
  w.Metric("kvmesh:request_rejected_total", "counter",
           "Requests the scheduler refused at submission (queue full, larger than the KV pool, "
           "invalid); the API's own 4xx answers are in kvmesh:http_responses_total.",
           st.rejected);
  w.Metric("kvmesh:request_cancelled_total", "counter", "Requests cancelled.", st.cancelled);
  if (s.replicas.size() > 1) {  // under --dp only: where the router sent the requests
    using St = serving::SchedulerStats;
    w.PerReplica("kvmesh:replica_requests_total", "counter",
                 "Requests routed to this data-parallel replica (accepted by its scheduler).",
                 s.replicas, [](const St& r) { return r.submitted; });
    w.PerReplica("kvmesh:replica_num_requests_running", "gauge",
                 "Requests in this replica's running batch.", s.replicas,
                 [](const St& r) { return r.running; });
    w.PerReplica("kvmesh:replica_num_requests_waiting", "gauge",
                 "Requests waiting in this replica's queue.", s.replicas,
                 [](const St& r) { return r.waiting; });
    w.PerReplica("kvmesh:replica_prefix_cache_hits_total", "counter",
                 "Prompt tokens found in this replica's prefix cache.", s.replicas,
                 [](const St& r) { return r.prefix_hit_tokens; });
    w.PerReplica(
        "kvmesh:replica_kv_cache_usage_perc", "gauge",
        "Fraction of this replica's KV blocks referenced (1 = full).", s.replicas, [](const St& r) {
          return r.blocks_total > 0 ? static_cast<double>(r.blocks_used) / r.blocks_total : 0.0;
        });
  }
  w.Histogram("kvmesh:time_to_first_token_seconds", "Time from submission to the first token.",
              s.ttft);
  w.Histogram("kvmesh:inter_token_latency_seconds", "Time between consecutive tokens.", s.itl);
  w.Histogram("kvmesh:e2e_request_latency_seconds", "Time from submission to completion.", s.e2e);
  w.Histogram("kvmesh:request_queue_time_seconds",
              "Time from submission to first admission into the running batch.", s.queue);
  w.Histogram("kvmesh:request_prefill_time_seconds",
              "Time from first admission to the first token (with any preemption before it).",
              s.prefill);
  w.Histogram("kvmesh:request_decode_time_seconds",
              "Time from the first token to completion, of requests that finished.", s.decode);
  w.PerCode("kvmesh:http_responses_total",
            "HTTP responses sent, by status code (a stream when its 200 header goes out).",
            http_responses);
  return w.Take();
}

}  // namespace kvmesh::server
