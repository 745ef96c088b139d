GREETING = "hello"
