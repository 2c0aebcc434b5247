"""The framework-free core: the estimate object, batch search, budgets and plans, verification, units, strategies."""
