// Helpers the stats sources share (stats.cpp, stats_coalesced.cpp): not part of the API.
#pragma once

#include "speedmatrix/stats.hpp"

namespace speedmatrix::detail {

// Whether the events are in the order the transport writes them: t_ns never goes back
// (one loop thread reads one monotonic clock). Then each request's events come in time
// order, and an arrival (a request's delivery) is whole once an event kDeliveryNs after
// its first shows.
bool time_ordered(const RecordView& r);

}  // namespace speedmatrix::detail
