from meshshard.cli import entry

entry()
