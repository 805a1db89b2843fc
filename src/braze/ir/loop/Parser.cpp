#include "braze/ir/loop/LoopText.h"

#include "braze/ir/sym/SymParse.h"
#include "braze/support/Diagnostic.h"
#include "braze/support/TextCursor.h"

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <optional>

namespace braze::loop {

namespace {

using Lookup = std::function<SymExpr(std::string_view)>;

/// Recursive-descent reader of the loop text form (grammar in LoopText.h). Whitespace
/// (newlines included) separates tokens; `#` comments run to the end of the line.
class ProgramParser : private TextCursor {
public:
  explicit ProgramParser(std::string_view text)
      : TextCursor(text, "loop-parser"),
        p_(std::make_unique<LoopProgram>(std::make_shared<sym::SymContext>())) {}

  std::unique_ptr<LoopProgram> parse() {
    if (peekWord() == "sizes") {
      pos_ += 5;
      do {
        skipSpace();
        size_t at = pos_;
        std::string name = word("a size symbol name");
        SymExpr s = p_->sym().sizeSymbol(name);
        if (!sizes_.emplace(name, s).second)
          fail(at, "size symbol '" + name + "' is declared twice");
        p_->sizeSymbols().push_back(s);
      } while (consumeIf(','));
    }
    while (peek() != '\0') {
      std::string_view w = peekWord();
      if (w == "buffer")
        parseBuffer();
      else if (w == "compute")
        parseCompute();
      else
        expected("'buffer' or 'compute'");
    }
    return std::move(p_);
  }

private:
  /// `%name`, with no space after the '%'; returns the name and sets `at` to the '%'.
  std::string valueName(size_t &at) {
    skipSpace();
    at = pos_;
    expect('%');
    if (pos_ >= text_.size() || !isWordChar(text_[pos_]))
      expected("a name after '%'");
    return word("a name");
  }

  // ---- symbolic expressions -----------------------------------------------------------------

  /// The text of one size/index expression: up to a separator outside parentheses.
  Slice scanSym() { return balancedText(",]}):=\n#", "an index expression"); }

  SymExpr parseSymText(const Slice &t, const Lookup &lookup) {
    try {
      return sym::parseSym(p_->sym(), t.text, lookup);
    } catch (const Diagnostic &e) {
      failInSlice(t.start, e.message());
    }
  }

  SymExpr sizeOnly(std::string_view name) const {
    auto it = sizes_.find(std::string(name));
    return it == sizes_.end() ? nullptr : it->second;
  }

  /// Indices of the current computation, then sizes.
  SymExpr inComputation(std::string_view name) const {
    auto it = vars_.find(std::string(name));
    return it == vars_.end() ? sizeOnly(name) : it->second;
  }

  std::vector<SymExpr> sizeList(char close) {
    std::vector<SymExpr> xs;
    if (consumeIf(close))
      return xs;
    do
      xs.push_back(parseSymText(scanSym(), [&](std::string_view n) { return sizeOnly(n); }));
    while (consumeIf(','));
    expect(close);
    return xs;
  }

  DType dtype() {
    skipSpace();
    size_t at = pos_;
    std::string name = word("a dtype");
    std::optional<DType> t = parseDType(name);
    if (!t)
      fail(at, "expected a dtype, found '" + name + "'");
    return *t;
  }

  // ---- buffers and computations -------------------------------------------------------------

  void parseBuffer() {
    expectWord("buffer");
    size_t at;
    std::string name = valueName(at);
    if (buffers_.count(name))
      fail(at, "buffer %" + name + " is declared twice");
    expect(':');
    DType t = dtype();
    expect('[');
    std::vector<SymExpr> shape = sizeList(']'), strides;
    if (pos_ < text_.size() && text_[pos_] == '{') {
      ++pos_;
      strides = sizeList('}');
    }
    skipSpace();
    size_t kindAt = pos_;
    std::string kindText = word("a buffer kind");
    BufferKind kind;
    if (kindText == "input")
      kind = BufferKind::Input;
    else if (kindText == "output")
      kind = BufferKind::Output;
    else if (kindText == "intermediate")
      kind = BufferKind::Intermediate;
    else
      fail(kindAt, "expected 'input', 'output' or 'intermediate', found '" + kindText + "'");
    int ioIndex = -1;
    if (std::isdigit(static_cast<unsigned char>(peek())) || peek() == '-')
      ioIndex = static_cast<int>(integer(std::numeric_limits<int>::min(),
                                         std::numeric_limits<int>::max()));
    Buffer *b = p_->addBuffer(name, t, std::move(shape), kind, ioIndex, std::move(strides));
    if (peekWord() == "as") { // the caller sees it in another shape: `as [dims]{strides}`
      expectWord("as");
      expect('[');
      b->callerShape = sizeList(']');
      expect('{');
      b->callerStrides = sizeList('}');
    }
    buffers_[name] = b;
  }

  int64_t integer(int64_t lo, int64_t hi) {
    skipSpace();
    size_t start = pos_, end = pos_ + (pos_ < text_.size() && text_[pos_] == '-');
    while (end < text_.size() && std::isdigit(static_cast<unsigned char>(text_[end])))
      ++end;
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(text_.data() + start, text_.data() + end, v);
    if (ec == std::errc::result_out_of_range || (ec == std::errc() && (v < lo || v > hi)))
      fail(start, "integer '" + std::string(text_.substr(start, end - start)) +
                      "' is out of range");
    if (ec != std::errc() || ptr != text_.data() + end)
      expected("an integer");
    pos_ = end;
    return v;
  }

  Buffer *bufferRef() {
    size_t at;
    std::string name = valueName(at);
    auto it = buffers_.find(name);
    if (it == buffers_.end())
      fail(at, "unknown buffer %" + name);
    return it->second;
  }

  /// `[i0 < s0, i1 < 8]`: fresh index symbols of the current computation.
  std::vector<SymExpr> indexDecls() {
    expect('[');
    std::vector<SymExpr> vars;
    if (consumeIf(']'))
      return vars;
    do {
      skipSpace();
      size_t at = pos_;
      std::string name = word("an index name");
      expect('<');
      SymExpr extent =
          parseSymText(scanSym(), [&](std::string_view n) { return inComputation(n); });
      if (vars_.count(name))
        fail(at, "index '" + name + "' is declared twice");
      SymExpr v = p_->sym().indexSymbol(name, extent);
      vars_.emplace(name, v);
      vars.push_back(v);
    } while (consumeIf(','));
    expect(']');
    return vars;
  }

  void parseCompute() {
    expectWord("compute");
    vars_.clear();
    indirect_.clear();
    values_.clear();
    Buffer *out = bufferRef();
    std::vector<SymExpr> vars = indexDecls(), rvars;
    ReduceKind reduce = ReduceKind::None;
    if (peekWord() == "reduce") {
      pos_ += 6;
      skipSpace();
      size_t at = pos_;
      std::string k = word("a reduction kind");
      if (!parseReduceKind(k, reduce) || reduce == ReduceKind::None)
        fail(at, "expected a reduction kind, found '" + k + "'");
    }
    if (peekWord() == "over") {
      pos_ += 4;
      rvars = indexDecls();
    }
    std::optional<ConvSpec> conv;
    if (peekWord() == "conv" || peekWord() == "conv_weight_grad" ||
        peekWord() == "conv_input_grad")
      conv = convSpec();
    std::optional<AttentionSpec> attention;
    if (peekWord().substr(0, 9) == "attention")
      attention = attentionSpec();
    bool scatter = peekWord() == "scatter";
    ReduceKind combine = ReduceKind::Sum;
    if (scatter) {
      expectWord("scatter");
      combine = scatterCombine();
    }
    expect('{');
    while (peekWord() != "yield")
      parseStatement();
    pos_ += 5;
    const Expr *value = nullptr;
    if (peek() == '%')
      value = use();
    const Expr *at = nullptr;
    if (scatter) {
      expectWord("at");
      at = use();
    }
    expect('}');
    Computation *c = p_->addComputation(out, std::move(vars), std::move(rvars), reduce, value);
    if (conv)
      c->ext = std::move(*conv);
    else if (attention)
      c->ext = std::move(*attention);
    else if (at)
      c->ext = ScatterSpec{at, combine};
  }

  /// add, prod, max or min (after `scatter`).
  ReduceKind scatterCombine() {
    skipSpace();
    size_t at = pos_;
    std::string k = word("a scatter's combine");
    for (ReduceKind r : {ReduceKind::Sum, ReduceKind::Prod, ReduceKind::Max, ReduceKind::Min})
      if (k == scatterCombineName(r))
        return r;
    fail(at, "expected a scatter's combine (add, prod, max or min), found '" + k + "'");
    return ReduceKind::Sum;
  }

  /// `(%buf, offset, [size, ..], [stride, ..])`
  AttentionOperand attentionOperand() {
    expect('(');
    AttentionOperand o;
    o.buffer = bufferRef();
    expect(',');
    o.offset = parseSymText(scanSym(), [&](std::string_view n) { return sizeOnly(n); });
    expect(',');
    expect('[');
    o.shape = sizeList(']');
    expect(',');
    expect('[');
    o.strides = sizeList(']');
    expect(')');
    return o;
  }

  /// The text of a number at the cursor (a sign, word characters, and an exponent's sign),
  /// consumed; empty where there is none.
  std::string numberText() {
    skipSpace();
    size_t end = pos_ + (pos_ < text_.size() && text_[pos_] == '-');
    while (end < text_.size() && (isWordChar(text_[end]) || text_[end] == '+' ||
                                  (text_[end] == '-' && (text_[end - 1] | 0x20) == 'e')))
      ++end;
    std::string v(text_.substr(pos_, end - pos_));
    pos_ = end;
    return v;
  }

  /// A number as printProgram writes a double (formatDouble).
  double number() {
    skipSpace();
    size_t at = pos_;
    std::string v = numberText();
    char *stop = nullptr;
    double x = std::strtod(v.c_str(), &stop);
    if (v.empty() || *stop != '\0')
      fail(at, "expected a number, found '" + v + "'");
    return x;
  }

  /// `PART(NAME=(..), .., [seed=(..), ][bias=(..), ]scale=s, causal=true|false[, safe=false]
  /// [, dropout=p])` as printProgram writes it: the operands the part reads, in order.
  AttentionSpec attentionSpec() {
    AttentionSpec a;
    size_t at = pos_;
    std::string part = word("an attention part");
    std::vector<std::pair<const char *, AttentionOperand *>> named;
    static const AttentionPart kParts[] = {AttentionPart::Output, AttentionPart::Lse,
                                           AttentionPart::GradQ, AttentionPart::GradK,
                                           AttentionPart::GradV};
    bool known = false;
    for (AttentionPart p : kParts)
      if (part == attentionPartName(p))
        a.part = p, known = true;
    if (!known)
      fail(at, "expected attention, attention_lse or attention_grad_q|k|v, found '" + part + "'");
    if (a.part == AttentionPart::Lse) {
      named = {{"q", &a.q}, {"k", &a.k}};
    } else if (a.part == AttentionPart::Output) {
      named = {{"q", &a.q}, {"k", &a.k}, {"v", &a.v}};
    } else {
      a.dout.emplace(), a.out.emplace(), a.lse.emplace();
      named = {{"dout", &*a.dout}, {"q", &a.q},     {"k", &a.k},
               {"v", &a.v},        {"out", &*a.out}, {"lse", &*a.lse}};
    }
    expect('(');
    for (auto [name, slot] : named) {
      expectWord(name);
      expect('=');
      *slot = attentionOperand();
      expect(',');
    }
    for (auto [name, slot] : {std::pair{"seed", &a.seed}, std::pair{"bias", &a.bias}})
      if (peekWord() == name) {
        expectWord(name);
        expect('=');
        *slot = attentionOperand();
        expect(',');
      }
    expectWord("scale");
    expect('=');
    a.scale = number();
    expect(',');
    expectWord("causal");
    expect('=');
    skipSpace();
    at = pos_;
    std::string c = word("true or false");
    if (c != "true" && c != "false")
      fail(at, "expected true or false, found '" + c + "'");
    a.causal = c == "true";
    if (consumeIf(',') && peekWord() == "safe") {
      expectWord("safe");
      expect('=');
      skipSpace();
      at = pos_;
      if (word("false") != "false")
        fail(at, "expected safe=false (safe is the default)");
      a.safe = false;
      consumeIf(',');
    }
    if (peekWord() == "dropout") {
      expectWord("dropout");
      expect('=');
      at = pos_;
      a.dropout = number();
      if (!a.seed || !(a.dropout > 0 && a.dropout < 1))
        fail(at, "dropout must be in (0, 1) and follow a seed operand");
    } else if (a.seed) {
      fail(pos_, "a seed operand needs dropout=p");
    }
    expect(')');
    return a;
  }

  /// `conv(%x, %w, stride=[..], padding=[..], dilation=[..], groups=g[, layout=nhwc])`,
  /// `conv_weight_grad(%x, %dy, ...)` or `conv_input_grad(%dy, %w, ...)`
  ConvSpec convSpec() {
    ConvSpec c;
    for (ConvDirectionKind d : {ConvDirectionKind::WeightGrad, ConvDirectionKind::InputGrad})
      if (ConvSpec named; (named.direction = d, peekWord() == named.name()))
        c.direction = d;
    expectWord(c.name());
    expect('(');
    bool forward = c.direction == ConvDirectionKind::Forward;
    (c.direction == ConvDirectionKind::InputGrad ? c.gradOut : c.input) = bufferRef();
    expect(',');
    (forward || c.direction == ConvDirectionKind::InputGrad ? c.weight : c.gradOut) = bufferRef();
    expect(',');
    c.stride = namedInts("stride");
    expect(',');
    c.padding = namedInts("padding");
    expect(',');
    c.dilation = namedInts("dilation");
    expect(',');
    expectWord("groups");
    expect('=');
    c.groups = integer();
    if (consumeIf(',')) {
      expectWord("layout");
      expect('=');
      skipSpace();
      size_t at = pos_;
      std::string layout = word("a layout");
      if (layout != "nhwc")
        fail(at, "expected layout 'nhwc', found '" + layout + "'");
      c.channelsLast = true;
    }
    expect(')');
    return c;
  }

  /// `name=[i, j, ...]` (possibly empty)
  std::vector<int64_t> namedInts(std::string_view name) {
    expectWord(name);
    expect('=');
    expect('[');
    std::vector<int64_t> xs;
    if (consumeIf(']'))
      return xs;
    do
      xs.push_back(integer());
    while (consumeIf(','));
    expect(']');
    return xs;
  }

  int64_t integer() {
    skipSpace();
    size_t at = pos_;
    bool negative = consumeIf('-');
    std::string digits = word("an integer");
    uint64_t v = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (ec != std::errc() || end != digits.data() + digits.size() ||
        v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail(at, "expected an integer, found '" + digits + "'");
    return negative ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
  }

  // ---- statements ---------------------------------------------------------------------------

  const Expr *use() {
    size_t at;
    std::string name = valueName(at);
    auto it = values_.find(name);
    if (it == values_.end())
      fail(at, "use of undefined value %" + name);
    return it->second;
  }

  /// `t < extent = %v` (an index symbol) or `t = %v` (a size symbol); one symbol per name
  /// and extent in a computation.
  IndirectBinding binding(std::map<std::string, SymExpr> &bound) {
    skipSpace();
    size_t at = pos_;
    std::string name = word("an indirect index name");
    SymExpr extent = nullptr;
    if (consumeIf('<'))
      extent = parseSymText(scanSym(), [&](std::string_view n) { return inComputation(n); });
    expect('=');
    const Expr *value = use();
    SymExpr &s = indirect_[{name, extent}];
    if (!s)
      s = extent ? p_->sym().indexSymbol(name, extent) : p_->sym().sizeSymbol(name);
    if (!bound.emplace(name, s).second)
      fail(at, "indirect index '" + name + "' is bound twice");
    return {s, value};
  }

  const Expr *load() {
    const Buffer *buf = bufferRef();
    expect('[');
    Slice index = scanSym();
    expect(']');
    std::vector<IndirectBinding> bindings;
    std::map<std::string, SymExpr> bound;
    if (peekWord() == "where") {
      pos_ += 5;
      do
        bindings.push_back(binding(bound));
      while (consumeIf(','));
    }
    SymExpr e = parseSymText(index, [&](std::string_view n) {
      auto it = bound.find(std::string(n));
      return it == bound.end() ? inComputation(n) : it->second;
    });
    expect(':');
    skipSpace();
    size_t at = pos_;
    DType type = dtype();
    if (type != buf->dtype)
      fail(at, "load of %" + buf->name + " has type " + std::string(dtypeName(buf->dtype)) +
                   ", not " + std::string(dtypeName(type)));
    return p_->exprs().load(buf, e, std::move(bindings));
  }

  const Expr *constant() {
    skipSpace();
    size_t at = pos_;
    std::string v = numberText();
    if (v.empty())
      expected("a constant");
    expect(':');
    DType t = dtype();
    if (t == DType::Bool) {
      if (v != "true" && v != "false")
        fail(at, "expected true or false, found '" + v + "'");
      return p_->exprs().constant(v == "true" ? 1.0 : 0.0, t);
    }
    if (isFloating(t)) {
      char *stop = nullptr;
      double d = std::strtod(v.c_str(), &stop);
      if (*stop != '\0')
        fail(at, "expected a floating-point constant, found '" + v + "'");
      return p_->exprs().constant(d, t);
    }
    int64_t i = 0;
    auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), i);
    if (ec != std::errc() || ptr != v.data() + v.size())
      fail(at, "expected an integer constant, found '" + v + "'");
    return p_->exprs().constant(static_cast<double>(i), t);
  }

  void parseStatement() {
    size_t at;
    std::string name = valueName(at);
    if (values_.count(name))
      fail(at, "value %" + name + " is defined twice");
    expect('=');
    skipSpace();
    size_t opAt = pos_;
    std::string head = word("'const', 'index', 'load' or an op name");
    const Expr *e = nullptr;
    if (head == "const") {
      e = constant();
    } else if (head == "index") {
      expect('(');
      SymExpr index =
          parseSymText(scanSym(), [&](std::string_view n) { return inComputation(n); });
      expect(')');
      expect(':');
      e = p_->exprs().indexValue(index, dtype());
    } else if (head == "load") {
      e = load();
    } else {
      ScalarOpKind op;
      if (!parseScalarOp(head, op))
        fail(opAt, "expected 'const', 'index', 'load' or an op name, found '" + head + "'");
      expect('(');
      std::vector<const Expr *> operands;
      if (!consumeIf(')')) {
        do
          operands.push_back(use());
        while (consumeIf(','));
        expect(')');
      }
      if (static_cast<int>(operands.size()) != scalarOpArity(op))
        fail(opAt, head + " takes " + std::to_string(scalarOpArity(op)) + " operands, got " +
                       std::to_string(operands.size()));
      expect(':');
      e = p_->exprs().op(op, std::move(operands), dtype());
    }
    values_.emplace(name, e);
  }

  std::unique_ptr<LoopProgram> p_;
  std::map<std::string, SymExpr> sizes_;
  std::map<std::string, Buffer *> buffers_;
  // Scopes of the computation being read.
  std::map<std::string, SymExpr> vars_;
  std::map<std::pair<std::string, SymExpr>, SymExpr> indirect_;
  std::map<std::string, const Expr *> values_;
};

} // namespace

std::unique_ptr<LoopProgram> parseProgram(std::string_view text) {
  return ProgramParser(text).parse();
}

} // namespace braze::loop
