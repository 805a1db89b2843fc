#pragma once
/// Typed views of the graph ops' attributes, generated from Ops.def: for each op E a class
/// attrs::E with an accessor per attribute, of its kind (bool, int64_t, double, string, IntList)
/// or its enum (AttrEnums.def; name_text() gives the value as written), and has_name() beside
/// each optional one:
///   const attrs::Convolution a(*n);  a.stride(), a.groups(), a.bias()
///   attrs::Scatter(*n).mode() == attrs::ScatterMode::Sum
/// A view of op E reads a node of op E or of any op whose schema holds E's attributes with the
/// same kinds (every reduction through attrs::Sum); any other node is an internal error, raised
/// where the view is made. The verifier has checked each attribute's presence, kind and enum
/// value, so the accessors only read.
#include "braze/ir/graph/Graph.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace braze::attrs {

#define BRAZE_ENUM_VALUE(value, text) value,
#define BRAZE_ATTR_ENUM(type, values) enum class type : uint8_t { values };
#include "braze/ir/graph/AttrEnums.def"

/// The graph-text values of enum T, in the enum's order.
template <class T>
const std::vector<std::string_view> &enumTexts();
#define BRAZE_ENUM_VALUE(value, text)
#define BRAZE_ATTR_ENUM(type, values)                                          \
  template <>                                                                  \
  const std::vector<std::string_view> &enumTexts<type>();
#include "braze/ir/graph/AttrEnums.def"

/// The position of `text` among `texts`: an internal error when it is none of them (the
/// verifier rejects such a graph first).
size_t enumIndex(const std::vector<std::string_view> &texts, std::string_view text,
                 std::string_view attribute);

/// v as graph text.
template <class T>
std::string_view enumText(T v) {
  return enumTexts<T>().at(static_cast<size_t>(v));
}
/// The value of enum T written `text`.
template <class T>
T enumValue(std::string_view text, std::string_view attribute = "") {
  return static_cast<T>(enumIndex(enumTexts<T>(), text, attribute));
}

/// Whether a node of op `actual` can be read through the view of op `view`: it has each of
/// view's required attributes, and each it has of view's is of the same kind and values, and
/// optional only where view's is (an optional one it lacks reads as absent).
bool viewable(OpKind actual, OpKind view);
/// viewable, or an internal error naming both ops.
void checkViewable(OpKind actual, OpKind view);

#define BRAZE_ATTR_GET_Bool(name)                                              \
  bool name() const { return attrs_->getBool(#name); }
#define BRAZE_ATTR_GET_Int(name)                                               \
  int64_t name() const { return attrs_->getInt(#name); }
#define BRAZE_ATTR_GET_Number(name)                                            \
  double name() const { return attrs_->getFloat(#name); }
#define BRAZE_ATTR_GET_String(name)                                            \
  const std::string &name() const { return attrs_->getString(#name); }
#define BRAZE_ATTR_GET_Ints(name)                                              \
  const IntList &name() const { return attrs_->getInts(#name); }
#define ATTR(name, kind) BRAZE_ATTR_GET_##kind(name)
#define OPT_ATTR(name, kind)                                                   \
  BRAZE_ATTR_GET_##kind(name) bool has_##name() const { return attrs_->has(#name); }
#define ENUM_ATTR(name, type)                                                  \
  type name() const { return enumValue<type>(attrs_->getString(#name), #name); }  \
  const std::string &name##_text() const { return attrs_->getString(#name); }
#define BRAZE_OP(E, cat, text, lo, hi, accessors)                              \
  class E {                                                                    \
  public:                                                                      \
    explicit E(const Node &n) : attrs_(&n.attrs()) { checkViewable(n.op(), OpKind::E); } \
    accessors                                                                  \
  private:                                                                     \
    const AttrMap *attrs_;                                                     \
  };
#include "braze/ir/graph/Ops.def"
#undef BRAZE_ATTR_GET_Bool
#undef BRAZE_ATTR_GET_Int
#undef BRAZE_ATTR_GET_Number
#undef BRAZE_ATTR_GET_String
#undef BRAZE_ATTR_GET_Ints

} // namespace braze::attrs
