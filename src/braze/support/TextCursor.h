#pragma once
/// A read position in the text form of an IR, shared by its recursive-descent parsers.
/// Whitespace (newlines included) separates tokens; `#` comments run to the end of the line.
/// Every error is a Diagnostic named after the parser ("graph-parser: line 3, column 7: ...").
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

namespace braze {

class TextCursor {
public:
  /// `errorOp` names the parser in every Diagnostic it throws.
  TextCursor(std::string_view text, std::string errorOp)
      : text_(text), errorOp_(std::move(errorOp)) {}

  /// A word is a run of letters, digits, '_' and '.'.
  static bool isWordChar(char c);

  /// Moves past whitespace and comments.
  void skipSpace();
  /// The next character after whitespace, or '\0' at the end of the text.
  char peek();
  /// The word at the cursor after whitespace (empty if there is none); does not consume it.
  std::string_view peekWord();
  /// Consumes `c` if it is the next character.
  bool consumeIf(char c);
  /// Consumes `c` or fails with "expected 'c', found ...".
  void expect(char c);
  /// Consumes and returns a word; `what` describes the word in the error when there is none.
  std::string word(std::string_view what);
  /// Consumes the word `w` or fails with "expected 'w', found ...".
  void expectWord(std::string_view w);
  /// The token at the cursor, for "found ..." in messages: a quoted word or character, or
  /// "end of input".
  std::string found();

  /// Throws the Diagnostic "line L, column C: message" for offset `at` (both 1-based).
  [[noreturn]] void fail(size_t at, const std::string &message);
  /// Fails at the next token with "expected <what>, found <token>".
  [[noreturn]] void expected(std::string_view what);
  /// Fails with a message of a parser that read only the slice starting at offset `start`:
  /// a leading "column N: " (N counted from 1 within the slice) becomes the line and column
  /// in the whole text; any other message is reported at `start`.
  [[noreturn]] void failInSlice(size_t start, const std::string &message);

  /// A part of the text and the offset where it starts.
  struct Slice {
    size_t start;
    std::string_view text;
  };
  /// Consumes text up to the first character of `stops` outside parentheses (a ')' closes only
  /// what it opened) and returns it without surrounding whitespace; the stop stays unread.
  /// Fails with "expected <what>" if that leaves nothing.
  Slice balancedText(std::string_view stops, std::string_view what);

protected:
  std::string_view text_;
  size_t pos_ = 0; ///< offset of the next unread character; at most text_.size()

private:
  std::string errorOp_;
};

} // namespace braze
