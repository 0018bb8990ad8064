#include "speedmatrix/records.hpp"

namespace speedmatrix {

void EventColumns::reserve(std::size_t n) {
  request.reserve(n);
  t_ns.reserve(n);
  tokens.reserve(n);
  server_ns.reserve(n);
}

}  // namespace speedmatrix
