/*!
 * \file plan/arena.h
 * \brief Arena placement of a plan's private buffers (intermediates of the run program).
 */
#ifndef BYOC_HETERO_PLAN_ARENA_H_
#define BYOC_HETERO_PLAN_ARENA_H_

#include "../planner.h"

namespace byoc_hetero {
namespace planning {

/*!
 * \brief Lay the private buffers out in one arena: buffers live from the first to the last
 *        run step that uses them; two whose lifetimes overlap never overlap in memory.
 *        Greedy, largest first, lowest offset that fits.
 */
void PlaceIntermediates(Plan& plan);

}  // namespace planning
}  // namespace byoc_hetero

#endif  // BYOC_HETERO_PLAN_ARENA_H_
