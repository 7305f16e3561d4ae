"""One module (or package) per user verb: report, compare, check, suggest, export, history; each over analyzer.api."""
