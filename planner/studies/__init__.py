"""Questions over many problems: rack comparisons, cost-speed frontiers, batch curves, price sheets, lifecycle."""
