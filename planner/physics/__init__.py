"""The physics of one replica: roofline terms, memory, communication over the graph, cost, prompt-cache tiers."""
