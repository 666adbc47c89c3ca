#include "model/chat_template.h"

#include <string>
#include <string_view>

namespace kvmesh::model {

namespace {

// Whether `text` holds Jinja rather than literal text: a tag, or a string literal being joined
// (`' + messages[0]['content'] + '`).
bool LooksLikeJinja(std::string_view text) {
  if (text.find("{{") != text.npos || text.find("{%") != text.npos) return true;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '+' && text[i] != '~') continue;  // Jinja joins strings with either
    size_t l = i, r = i + 1;
    while (l > 0 && text[l - 1] == ' ') --l;
    while (r < text.size() && text[r] == ' ') ++r;
    const auto quote = [](char c) { return c == '\'' || c == '"'; };
    if ((l > 0 && quote(text[l - 1])) || (r < text.size() && quote(text[r]))) return true;
  }
  return false;
}

// The default system message a ChatML template writes when the conversation has none: the
// literal text of its '<|im_start|>system' turn, with the newline after the role written as
// one or, inside a Jinja string, as the two characters '\n' (then the string's escapes are
// undone). The first such turn that is literal text counts (templates often build the turn
// from the messages first, as Qwen2.5's does for tools, and write the default in an else).
// Empty when there is none.
std::string DefaultSystem(std::string_view tmpl) {
  for (const bool escaped : {false, true}) {
    const std::string_view start = escaped ? "<|im_start|>system\\n" : "<|im_start|>system\n";
    std::string text;
    bool found = false;
    for (size_t at = tmpl.find(start); at != tmpl.npos && !found;
         at = tmpl.find(start, at + start.size())) {
      const size_t b = at + start.size();
      const size_t e = tmpl.find("<|im_end|>", b);
      if (e == tmpl.npos) break;
      text = std::string(tmpl.substr(b, e - b));
      found = !LooksLikeJinja(text);
    }
    if (!found) continue;
    if (!escaped) return text;
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] != '\\' || i + 1 == text.size()) {
        out += text[i];
        continue;
      }
      const char c = text[++i];
      out += c == 'n' ? '\n' : c == 't' ? '\t' : c;  // \\ \' \" stand for themselves
    }
    return out;
  }
  return "";
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::FromGguf(const GgufFile& f) {
  auto tmpl = f.GetString("tokenizer.chat_template");
  if (!tmpl.ok()) return tmpl.status();
  if (tmpl->find("<|im_start|>") == std::string_view::npos ||
      tmpl->find("<|im_end|>") == std::string_view::npos) {
    return absl::InvalidArgumentError(
        "tokenizer.chat_template: only ChatML templates are supported");
  }
  ChatTemplate t;
  t.default_system_ = DefaultSystem(*tmpl);
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
