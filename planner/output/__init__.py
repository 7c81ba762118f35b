"""What users read and run: tables, JSON records, charts, the independent plan check and engine exports."""
