"""The command line: parser and one handler per command."""
