// Op labels and keep-list entries (see op_label.h).
#include "memtrain/ckpt/op_label.h"

#include "memtrain/core/error.h"

#include <utility>

namespace memtrain::ckpt {
namespace {

// The innermost live OpLabel's string: the labels are stack objects, so the outer ones outlive the inner.
thread_local const std::string* t_label = nullptr;

}  // namespace

OpLabel::OpLabel(std::string label) : label_(std::move(label)), previous_(t_label) { t_label = &label_; }

OpLabel::~OpLabel() { t_label = previous_; }

std::string_view current_op_label() { return t_label ? std::string_view(*t_label) : std::string_view(); }

void check_keep_entry(std::string_view entry, std::string_view where) {
  const std::size_t at = entry.find('@');
  if (at == std::string_view::npos) {
    MT_CHECK(!entry.empty(), where, "empty op name in the keep list");
    return;
  }
  const std::string_view label = entry.substr(at + 1);
  MT_CHECK(label.find('@') == std::string_view::npos, where,
           "keep entry '{}' has more than one '@' (forms: op, op@label, @label)", entry);
  MT_CHECK(!label.empty(), where, "keep entry '{}' has an empty label after '@' (forms: op, op@label, @label)", entry);
}

bool keep_entry_matches(std::string_view entry, std::string_view op, std::string_view label) {
  const std::size_t at = entry.find('@');
  if (at == std::string_view::npos) return entry == op;
  const std::string_view entry_op = entry.substr(0, at);
  return (entry_op.empty() || entry_op == op) && entry.substr(at + 1) == label;
}

}  // namespace memtrain::ckpt
