#include "braze/ir/graph/OpAttrs.h"

#include "braze/support/Check.h"

#include <algorithm>

namespace braze::attrs {

#define BRAZE_ENUM_VALUE(value, text) text,
#define BRAZE_ATTR_ENUM(type, values)                                          \
  template <>                                                                  \
  const std::vector<std::string_view> &enumTexts<type>() {                     \
    static const std::vector<std::string_view> kTexts{values};                 \
    return kTexts;                                                             \
  }
#include "braze/ir/graph/AttrEnums.def"

size_t enumIndex(const std::vector<std::string_view> &texts, std::string_view text,
                 std::string_view attribute) {
  auto it = std::find(texts.begin(), texts.end(), text);
  BRAZE_CHECK(it != texts.end()) << "attribute '" << attribute << "' has the value '" << text
                                 << "', which its enum does not have";
  return static_cast<size_t>(it - texts.begin());
}

bool viewable(OpKind actual, OpKind view) {
  if (actual == view)
    return true;
  const std::vector<AttrSpec> &have = opSchema(actual).attrs;
  for (const AttrSpec &want : opSchema(view).attrs) {
    auto it = std::find_if(have.begin(), have.end(),
                           [&](const AttrSpec &a) { return a.name == want.name; });
    if (it == have.end() ? !want.optional
                         : it->kind != want.kind || it->values != want.values ||
                               (it->optional && !want.optional))
      return false;
  }
  return true;
}

void checkViewable(OpKind actual, OpKind view) {
  BRAZE_CHECK(viewable(actual, view)) << "the attributes of a " << opName(actual)
                                      << " node read through the view of " << opName(view);
}

} // namespace braze::attrs
