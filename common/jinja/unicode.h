#pragma once
// UTF-8 as Python's str sees it: code points for length, indexing and slicing, Python's
// str.isspace() set for strip(), and repr/JSON escaping. Invalid UTF-8 never reaches here: the
// request's JSON parser refuses it.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tailserve::jinja {

std::vector<char32_t> DecodeUtf8(std::string_view s);
void AppendUtf8(char32_t cp, std::string* out);
std::string EncodeUtf8(const std::vector<char32_t>& cps);
// Python's str.isspace() for one code point.
bool IsPythonSpace(char32_t cp);
// str.strip / lstrip / rstrip: `chars` null strips whitespace, else the code points it holds.
std::string Strip(std::string_view s, const std::string* chars, bool left, bool right);
// str.upper() / lower() / title() / capitalize() by Unicode's simple case mappings (utf8proc):
// Python's full mappings differ only where one character becomes several (ß.upper() is SS).
std::string Upper(std::string_view s);
std::string Lower(std::string_view s);
std::string Title(std::string_view s);
std::string Capitalize(std::string_view s);
// Python's str.isprintable() for one code point (repr keeps printable ones, escapes the rest).
bool IsPythonPrintable(char32_t cp);

}  // namespace tailserve::jinja
