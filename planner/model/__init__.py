"""The transformer: architecture (parameter and KV counts), the model catalog and the Hugging Face importer."""
