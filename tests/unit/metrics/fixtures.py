"""A fixed caption corpus for the metric tests: 24 items, 5 references each.

Candidates cover exact matches (case and punctuation changed), close paraphrases, partial
matches, unrelated captions, a one-word caption and an empty one.
"""

from __future__ import annotations

REFERENCES: list[list[str]] = [
    ["A dog barks loudly in the distance.", "A dog is barking far away.",
     "Somewhere a dog keeps barking.", "A distant dog barks repeatedly.",
     "Barking of a dog can be heard in the distance."],
    ["Rain falls steadily on a tin roof.", "Heavy rain is hitting a metal roof.",
     "Raindrops patter on a roof.", "It is raining hard on a tin roof.",
     "Rain pours down onto a corrugated roof."],
    ["Birds are chirping in the trees.", "Several birds sing in a forest.",
     "Birds chirp and tweet outside.", "Many birds are singing in the morning.",
     "A flock of birds chirps in the woods."],
    ["A car drives past on a wet road.", "A vehicle passes by on a rainy street.",
     "A car speeds by on the road.", "Traffic passes on a wet street.",
     "A car goes by splashing through puddles."],
    ["A man is speaking into a microphone.", "A man talks to an audience.",
     "Someone gives a speech with a microphone.", "A male voice speaks loudly.",
     "A man delivers a speech in a hall."],
    ["Water is running from a faucet.", "A tap is left running into a sink.",
     "Water flows out of a tap.", "Someone runs water in a kitchen sink.",
     "A faucet pours water into a basin."],
    ["A crowd cheers and applauds.", "People clap and cheer loudly.",
     "An audience applauds enthusiastically.", "A large crowd is cheering.",
     "Applause and cheering from a crowd."],
    ["A door creaks open slowly.", "A wooden door creaks as it opens.",
     "Someone slowly opens a creaky door.", "The hinges of a door squeak.",
     "A door is opened with a creak."],
    ["A train passes by on the tracks.", "A train rumbles along the railway.",
     "A passing train blows its horn.", "A train goes by at high speed.",
     "The sound of a train moving on tracks."],
    ["Waves crash onto the beach.", "Ocean waves break on the shore.",
     "The sea washes onto a sandy beach.", "Waves are crashing on rocks.",
     "Surf rolls onto the shore repeatedly."],
    ["A baby is crying loudly.", "An infant cries and screams.",
     "A small child is crying.", "A baby wails in a room.",
     "The cries of a baby fill the room."],
    ["Footsteps walk across a wooden floor.", "Someone walks on a creaky floor.",
     "A person's footsteps on wooden boards.", "Steps echo in a hallway.",
     "A person walks slowly across the room."],
    ["A clock is ticking.", "The ticking of a clock in a quiet room.",
     "A clock ticks steadily.", "A wall clock ticks.", "Ticking sounds from an old clock."],
    ["Wind blows through the leaves.", "Strong wind rustles the trees.",
     "A gust of wind blows outside.", "The wind howls through the branches.",
     "Leaves rustle in the wind."],
    ["A cat meows several times.", "A kitten is meowing.", "A cat meows loudly for food.",
     "A cat cries and meows.", "Meowing of a small cat."],
    ["Glass shatters on the floor.", "A glass breaks into pieces.",
     "Someone drops a glass and it shatters.", "The sound of breaking glass.",
     "A window pane smashes."],
    ["An engine idles and then revs.", "A motorcycle engine revs up.",
     "A car engine starts and revs.", "An engine runs loudly.",
     "A motor is idling before accelerating."],
    ["People are talking in a busy cafe.", "Many people chatter in a restaurant.",
     "Conversations in a crowded room.", "A group of people talk at once.",
     "Background chatter of people in a cafe."],
    ["A phone is ringing.", "A telephone rings several times.", "A cell phone rings loudly.",
     "The ringtone of a phone plays.", "A phone rings and nobody answers."],
    ["Thunder rumbles in the distance.", "A loud thunderclap during a storm.",
     "Thunder rolls across the sky.", "A storm with rumbling thunder.",
     "Distant thunder and rain."],
    ["A person types on a keyboard.", "Someone is typing quickly on a computer.",
     "Keys clicking as a person types.", "Typing on a mechanical keyboard.",
     "A keyboard clatters as someone writes."],
    ["A helicopter flies overhead.", "The rotor of a helicopter whirs above.",
     "A helicopter passes over the area.", "A helicopter hovers nearby.",
     "Helicopter blades chop through the air."],
    ["A woman sings a song.", "A female voice sings softly.", "A woman is singing a melody.",
     "A lady sings along to music.", "Singing by a woman with a gentle voice."],
    ["A bell rings three times.", "A church bell tolls.", "Bells are ringing in a tower.",
     "A large bell chimes.", "The ringing of a bell echoes."],
]

CANDIDATES: list[str] = [
    "a dog is barking far away",                 # exact match (case, punctuation)
    "Rain falls on a metal roof.",               # close paraphrase
    "birds are singing in the trees",            # close
    "a car passes by on a wet road",             # close
    "A man speaks.",                             # short, partial
    "water is running from a faucet",            # exact
    "people are clapping and cheering",          # paraphrase
    "a cat meows",                               # unrelated
    "a train passes by on the tracks",           # exact
    "waves crash on the shore",                  # close
    "a baby is crying",                          # close
    "footsteps",                                 # one word
    "a clock is ticking in a quiet room",        # mixed
    "the wind is blowing",                       # partial
    "a cat meows loudly for food!",              # exact
    "music plays in the background",             # unrelated
    "an engine revs",                            # partial
    "people talk",                               # short
    "a phone is ringing and ringing and ringing",  # repetition (clipping)
    "",                                          # empty
    "someone is typing on a keyboard",           # close
    "a helicopter flies overhead",               # exact
    "a woman is singing a song softly",          # close, longer
    "a dog's bell rings; it's loud",             # clitics and punctuation
]
