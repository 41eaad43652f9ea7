"""Files and values that come in and go out: input text files (nets, plans, profiles), sizes
and seeds as people write them, where shipped and user files live, and the rules for every
output path hpctrain writes."""
