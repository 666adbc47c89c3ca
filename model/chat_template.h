// Chat templates. kvmesh renders ChatML (the template SmolLM2 and many others ship), including
// the default system message the model's own template inserts when the conversation has none.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/gguf.h"

namespace kvmesh::model {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

class ChatTemplate {
 public:
  // From tokenizer.chat_template. InvalidArgument if the template is not ChatML-shaped; the
  // default system message is read out of the template text.
  static absl::StatusOr<ChatTemplate> FromGguf(const GgufFile& f);

  // "<|im_start|>role\ncontent<|im_end|>\n" per message, with the default system message first
  // if messages[0] is not a system message, and "<|im_start|>assistant\n" if add_generation_prompt.
  std::string Render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  const std::string& default_system() const { return default_system_; }

 private:
  std::string default_system_;  // empty: none
};

}  // namespace kvmesh::model
