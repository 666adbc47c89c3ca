#include "model/chat_template.h"

namespace kvmesh::model {

absl::StatusOr<ChatTemplate> ChatTemplate::FromGguf(const GgufFile& f) {
  auto tmpl = f.GetString("tokenizer.chat_template");
  if (!tmpl.ok()) return tmpl.status();
  if (tmpl->find("<|im_start|>") == std::string_view::npos ||
      tmpl->find("<|im_end|>") == std::string_view::npos) {
    return absl::InvalidArgumentError(
        "tokenizer.chat_template: only ChatML templates are supported");
  }
  ChatTemplate t;
  // The default system turn appears literally as '<|im_start|>system\n...<|im_end|>'.
  constexpr std::string_view kSys = "<|im_start|>system\n";
  const size_t at = tmpl->find(kSys);
  if (at != std::string_view::npos) {
    const size_t b = at + kSys.size();
    const size_t e = tmpl->find("<|im_end|>", b);
    if (e != std::string_view::npos) t.default_system_ = std::string(tmpl->substr(b, e - b));
  }
  return t;
}

std::string ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) const {
  std::string out;
  if (!default_system_.empty() && (messages.empty() || messages[0].role != "system")) {
    out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
  }
  for (const ChatMessage& m : messages) {
    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace kvmesh::model
