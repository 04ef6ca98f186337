# -DFERRY_SANITIZE=address;undefined (ASan+UBSan) or thread. Debug info, no recovery:
# the first report fails the test.
if(FERRY_SANITIZE)
  string(REPLACE ";" "," _san "${FERRY_SANITIZE}")
  # -O1 keeps the sanitized suite (which trains a few hundred steps) inside CI time.
  add_compile_options(-fsanitize=${_san} -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1)
  add_link_options(-fsanitize=${_san})
  add_compile_definitions(FERRY_SANITIZE=1)
endif()
