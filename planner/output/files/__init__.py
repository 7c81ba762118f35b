"""Files the exports ship beside the engines' commands (read as text, never imported by the planner)."""
