#include <gtest/gtest.h>
#include "speedmatrix/sim.hpp"
TEST(SimEngine, Placeholder) { EXPECT_EQ(speedmatrix::sim::token_word(0), "a"); }
