// Placeholder so the library builds until config.cpp lands; removed then.
