#include "braze/ir/graph/GraphText.h"

#include "braze/ir/sym/SymParse.h"
#include "braze/support/Diagnostic.h"
#include "braze/support/TextCursor.h"

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>

namespace braze {

namespace {

/// Recursive-descent reader of the graph text form. Whitespace (newlines included) separates
/// tokens; `#` comments run to the end of the line.
class GraphParser : private TextCursor {
public:
  explicit GraphParser(std::string_view text)
      : TextCursor(text, "graph-parser"), g_(std::make_unique<Graph>()) {}

  std::unique_ptr<Graph> parse() {
    if (peekWord() == "sizes") {
      word("'sizes'");
      do
        declareSize(word("a size symbol name"));
      while (consumeIf(','));
    }
    expectWord("graph");
    expect('(');
    if (!consumeIf(')')) {
      do
        parseInput();
      while (consumeIf(','));
      expect(')');
    }
    expect('{');
    while (peekWord() != "return")
      parseNode();
    word("'return'");
    std::vector<Node *> outputs;
    std::vector<std::vector<SymExpr>> layouts;
    if (peek() == '%') {
      do {
        outputs.push_back(use());
        layouts.emplace_back();
        if (consumeIf('{'))
          layouts.back() = symList('}');
      } while (consumeIf(','));
    }
    g_->setOutputs(std::move(outputs));
    for (size_t k = 0; k < layouts.size(); ++k)
      g_->setOutputStrides(k, std::move(layouts[k]));
    expect('}');
    skipSpace();
    if (pos_ < text_.size())
      expected("end of input");
    return std::move(g_);
  }

private:
  // ---- grammar ------------------------------------------------------------------------------

  void declareSize(const std::string &name) {
    if (!sizes_.emplace(name, g_->newSizeSymbol(name)).second)
      fail(pos_ - name.size(), "size symbol '" + name + "' is declared twice");
  }

  /// `%name`, with no space after the '%'.
  std::string valueName() {
    expect('%');
    if (pos_ >= text_.size() || !isWordChar(text_[pos_]))
      expected("a value name after '%'");
    return word("a value name");
  }

  Node *use() {
    skipSpace();
    size_t at = pos_;
    std::string name = valueName();
    auto it = values_.find(name);
    if (it == values_.end())
      fail(at, "use of undefined value %" + name);
    return it->second;
  }

  void checkFresh(size_t at, const std::string &name) {
    if (values_.count(name))
      fail(at, "value %" + name + " is defined twice");
  }

  /// One size expression: the text up to a ',' or closing bracket outside parentheses.
  SymExpr symExpr() {
    Slice src = balancedText(",]})\n", "a size expression");
    auto lookup = [&](std::string_view name) -> SymExpr {
      auto it = sizes_.find(std::string(name));
      if (it != sizes_.end())
        return it->second;
      SymExpr s = g_->newSizeSymbol(std::string(name));
      sizes_.emplace(std::string(name), s);
      return s;
    };
    try {
      return sym::parseSym(g_->sym(), src.text, lookup);
    } catch (const Diagnostic &e) {
      failInSlice(src.start, e.message());
    }
  }

  std::vector<SymExpr> symList(char close) {
    std::vector<SymExpr> xs;
    if (consumeIf(close))
      return xs;
    do
      xs.push_back(symExpr());
    while (consumeIf(','));
    expect(close);
    return xs;
  }

  TensorType type() {
    skipSpace();
    size_t at = pos_;
    std::string name = word("a dtype");
    std::optional<DType> dtype = parseDType(name);
    if (!dtype)
      fail(at, "expected a dtype, found '" + name + "'");
    TensorType t;
    t.dtype = *dtype;
    expect('[');
    t.shape = symList(']');
    if (peek() == '{' && !attrListAhead()) {
      ++pos_;
      t.strides = symList('}');
    }
    return t;
  }

  /// Whether the '{' at the cursor opens an attribute list (`{}` or `{name=`), not strides.
  bool attrListAhead() {
    size_t saved = pos_;
    ++pos_;
    bool isAttrs = peek() == '}';
    if (!isAttrs && !peekWord().empty()) {
      pos_ += peekWord().size();
      isAttrs = peek() == '=';
    }
    pos_ = saved;
    return isAttrs;
  }

  AttrValue attrValue() {
    char c = peek();
    size_t at = pos_;
    if (c == '"') {
      size_t end = text_.find('"', pos_ + 1);
      if (end == std::string_view::npos)
        fail(at, "unterminated string");
      std::string s(text_.substr(pos_ + 1, end - pos_ - 1));
      pos_ = end + 1;
      return s;
    }
    if (c == '[') {
      ++pos_;
      IntList xs;
      if (consumeIf(']'))
        return xs;
      do {
        // Lists hold integers only: a nested list is an error here, before any recursion.
        if (peek() == '[' || peek() == '"')
          fail(pos_, "expected an integer list element");
        AttrValue v = attrValue();
        if (!std::holds_alternative<int64_t>(v))
          fail(at, "expected an integer list element");
        xs.push_back(std::get<int64_t>(v));
      } while (consumeIf(','));
      expect(']');
      return xs;
    }
    bool negative = c == '-';
    if (negative)
      ++pos_;
    std::string_view w = peekWord();
    if (w == "true" || w == "false") {
      if (negative)
        expected("a number after '-'");
      pos_ += w.size();
      return w == "true";
    }
    if (w == "inf" || w == "nan") {
      pos_ += w.size();
      double d = w == "inf" ? std::numeric_limits<double>::infinity()
                            : std::numeric_limits<double>::quiet_NaN();
      return negative ? -d : d;
    }
    // A number: digits with an optional fraction and exponent.
    size_t start = negative ? at : pos_;
    size_t end = pos_;
    bool isFloat = false;
    while (end < text_.size()) {
      char d = text_[end];
      if (std::isdigit(static_cast<unsigned char>(d))) {
        ++end;
      } else if (d == '.' || d == 'e' || d == 'E') {
        isFloat = true;
        ++end;
        if ((d == 'e' || d == 'E') && end < text_.size() &&
            (text_[end] == '+' || text_[end] == '-'))
          ++end;
      } else {
        break;
      }
    }
    if (end == pos_ || !std::isdigit(static_cast<unsigned char>(text_[pos_])))
      expected("an attribute value");
    std::string num(text_.substr(start, end - start));
    pos_ = end;
    if (isFloat) {
      char *stop = nullptr;
      double d = std::strtod(num.c_str(), &stop);
      if (*stop != '\0')
        fail(start, "malformed number '" + num + "'");
      return d;
    }
    int64_t v = 0;
    auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
    if (ec != std::errc() || p != num.data() + num.size())
      fail(start, "integer '" + num + "' is out of range");
    return v;
  }

  AttrMap attrs() {
    AttrMap m;
    expect('{');
    if (consumeIf('}'))
      return m;
    do {
      skipSpace();
      size_t at = pos_;
      std::string name = word("an attribute name");
      if (m.has(name))
        fail(at, "attribute '" + name + "' appears twice");
      expect('=');
      m.set(name, attrValue());
    } while (consumeIf(','));
    expect('}');
    return m;
  }

  void parseInput() {
    skipSpace();
    size_t at = pos_;
    std::string name = valueName();
    expect(':');
    TensorType t = type();
    AttrMap a;
    if (peek() == '{')
      a = attrs();
    else
      a.set("index", static_cast<int64_t>(g_->inputs().size()));
    checkFresh(at, name);
    values_.emplace(name, g_->addNode(OpKind::Input, {}, std::move(a), std::move(t), name));
  }

  void parseNode() {
    skipSpace();
    size_t at = pos_;
    std::string name = valueName();
    expect('=');
    skipSpace();
    size_t opAt = pos_;
    std::string opText = word("an op name");
    OpKind op;
    if (!parseOpKind(opText, op) || op == OpKind::Input)
      fail(opAt, "expected an op name, found '" + opText + "'");
    expect('(');
    std::vector<Node *> operands;
    if (!consumeIf(')')) {
      do
        operands.push_back(use());
      while (consumeIf(','));
      expect(')');
    }
    AttrMap a;
    if (peek() == '{')
      a = attrs();
    expect(':');
    TensorType t = type();
    checkFresh(at, name);
    Node *n = g_->addNode(op, std::move(operands), std::move(a), std::move(t), name);
    if (peekWord() == "stored" || peekWord() == "stored_at_use")
      g_->setStorage(n, word("'stored'") == "stored" ? Storage::Stored : Storage::StoredAtUse);
    values_.emplace(name, n);
  }

  std::unique_ptr<Graph> g_;
  std::map<std::string, SymExpr> sizes_;
  std::map<std::string, Node *> values_;
};

} // namespace

std::unique_ptr<Graph> parseGraph(std::string_view text) { return GraphParser(text).parse(); }

} // namespace braze
