#include "braze/support/TextCursor.h"

#include "braze/support/Diagnostic.h"

#include <cctype>

namespace braze {

bool TextCursor::isWordChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
}

void TextCursor::skipSpace() {
  while (pos_ < text_.size()) {
    char c = text_[pos_];
    if (c == '#') {
      while (pos_ < text_.size() && text_[pos_] != '\n')
        ++pos_;
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      ++pos_;
    } else {
      break;
    }
  }
}

char TextCursor::peek() {
  skipSpace();
  return pos_ < text_.size() ? text_[pos_] : '\0';
}

std::string_view TextCursor::peekWord() {
  skipSpace();
  size_t end = pos_;
  while (end < text_.size() && isWordChar(text_[end]))
    ++end;
  return text_.substr(pos_, end - pos_);
}

bool TextCursor::consumeIf(char c) {
  if (peek() != c)
    return false;
  ++pos_;
  return true;
}

void TextCursor::expect(char c) {
  if (!consumeIf(c))
    expected(std::string("'") + c + "'");
}

std::string TextCursor::word(std::string_view what) {
  std::string_view w = peekWord();
  if (w.empty())
    expected(what);
  pos_ += w.size();
  return std::string(w);
}

void TextCursor::expectWord(std::string_view w) {
  if (peekWord() != w)
    expected(std::string(1, '\'').append(w).append("'"));
  pos_ += w.size();
}

std::string TextCursor::found() {
  skipSpace();
  if (pos_ >= text_.size())
    return "end of input";
  std::string_view w = peekWord();
  std::string token = w.empty() ? std::string(1, text_[pos_]) : std::string(w);
  return "'" + token + "'";
}

void TextCursor::fail(size_t at, const std::string &message) {
  size_t line = 1, column = 1;
  for (size_t i = 0; i < at && i < text_.size(); ++i) {
    if (text_[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  throw Diagnostic(errorOp_, "",
                   "line " + std::to_string(line) + ", column " + std::to_string(column) + ": " +
                       message);
}

void TextCursor::expected(std::string_view what) {
  skipSpace();
  fail(pos_, "expected " + std::string(what) + ", found " + found());
}

void TextCursor::failInSlice(size_t start, const std::string &message) {
  size_t column = 0, i = 7;
  if (message.rfind("column ", 0) == 0) {
    while (i < message.size() && std::isdigit(static_cast<unsigned char>(message[i])))
      column = column * 10 + static_cast<size_t>(message[i++] - '0');
    if (column > 0 && message.compare(i, 2, ": ") == 0)
      fail(start + column - 1, message.substr(i + 2));
  }
  fail(start, message);
}

TextCursor::Slice TextCursor::balancedText(std::string_view stops, std::string_view what) {
  skipSpace();
  size_t start = pos_;
  int depth = 0;
  for (; pos_ < text_.size(); ++pos_) {
    char c = text_[pos_];
    if (c == '(')
      ++depth;
    else if (c == ')' && depth > 0)
      --depth;
    else if (depth == 0 && stops.find(c) != std::string_view::npos)
      break;
  }
  std::string_view src = text_.substr(start, pos_ - start);
  while (!src.empty() && std::isspace(static_cast<unsigned char>(src.back())))
    src.remove_suffix(1);
  if (src.empty()) {
    pos_ = start;
    expected(what);
  }
  return {start, src};
}

} // namespace braze
